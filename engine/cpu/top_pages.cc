#include "engine/cpu/top_pages.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "engine/common/check.h"
#include "engine/cpu/scratch.h"

namespace specula {

namespace {

// A total order of (score, index) as one integer, larger is better: higher score, NaN below
// every number, -0 as +0, then the lower index. Integer comparisons make the selection several
// times faster than a comparator that checks NaN; kernels/sparse.cu ranks with the same key.
uint64_t RankKey(float score, int32_t index) {
  uint32_t bits = 0;
  if (!std::isnan(score)) {
    const float s = score == 0.0f ? 0.0f : score;
    std::memcpy(&bits, &s, sizeof(bits));
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

// SortPageSet compares below this many pages, or when the set fills less than 1/kMarkedSortSpan
// of its range: marking costs a pass over the whole range.
constexpr size_t kMarkedSortMinPages = 64;
constexpr size_t kMarkedSortSpan = 16;

// Each thread's ranking keys, reserved to their floor on first use.
std::vector<uint64_t>& ThreadKeys() {
  thread_local std::vector<uint64_t> keys = [] {
    std::vector<uint64_t> k;
    ReserveScratch(k, 1);
    return k;
  }();
  return keys;
}

// Each thread's SortPageSet marks, reserved to their floor on first use.
std::vector<uint8_t>& ThreadMarks() {
  thread_local std::vector<uint8_t> marks = [] {
    std::vector<uint8_t> m;
    ReserveScratch(m, 1);
    return m;
  }();
  return marks;
}

int32_t IndexOf(uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - (key & 0xFFFFFFFFu)); }

}  // namespace

void PartitionTopPages(absl::Span<const float> scores, int32_t first, int32_t k,
                       std::vector<int32_t>* out) {
  CHECK(k >= 0 && first >= 0 && first <= k);
  std::vector<uint64_t>& keys = ThreadKeys();
  const size_t n = scores.size();
  ReserveScratch(keys, n);
  keys.resize(n);
  for (size_t i = 0; i < n; ++i) keys[i] = RankKey(scores[i], static_cast<int32_t>(i));
  const size_t take = std::min<size_t>(static_cast<size_t>(k), n);
  const size_t set = std::min<size_t>(static_cast<size_t>(first), take);
  const auto better = std::greater<uint64_t>();
  if (take < n) std::nth_element(keys.begin(), keys.begin() + take, keys.end(), better);
  if (set > 0 && set < take) {
    std::nth_element(keys.begin(), keys.begin() + set, keys.begin() + take, better);
  }
  std::sort(keys.begin() + set, keys.begin() + take, better);
  out->resize(take);
  for (size_t i = 0; i < take; ++i) (*out)[i] = IndexOf(keys[i]);
}

void ReserveTopPagesScratch() {
  (void)ThreadKeys();
  (void)ThreadMarks();
}

void SortPageSet(std::vector<int32_t>& pages, int32_t begin, int32_t end) {
  CHECK_LE(begin, end);
  const size_t span = static_cast<size_t>(end - begin);
  if (pages.size() < kMarkedSortMinPages || pages.size() * kMarkedSortSpan < span) {
    std::sort(pages.begin(), pages.end());
    CHECK(pages.empty() || (pages.front() >= begin && pages.back() < end &&
                            std::adjacent_find(pages.begin(), pages.end()) == pages.end()))
        << "pages to sort must be distinct and in [" << begin << ", " << end << ")";
    return;
  }
  std::vector<uint8_t>& marks = ThreadMarks();
  ReserveScratch(marks, span);
  marks.assign(span, 0);
  for (int32_t p : pages) {
    CHECK(p >= begin && p < end && marks[p - begin] == 0)
        << "pages to sort must be distinct and in [" << begin << ", " << end << "): " << p;
    marks[p - begin] = 1;
  }
  size_t n = 0;
  for (int32_t p = begin; p < end; ++p) {
    if (marks[p - begin] != 0) pages[n++] = p;
  }
}

void RankTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  PartitionTopPages(scores, 0, k, out);
}

void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  RankTopPages(scores, k, out);
  std::sort(out->begin(), out->end());
}

}  // namespace specula
