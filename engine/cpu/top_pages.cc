#include "engine/cpu/top_pages.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/check.h"

namespace specula {

namespace {

// A strict weak order even with NaN (which would break a plain `>`): higher score first, NaN
// last, then lower index, so the result is deterministic.
struct Better {
  absl::Span<const float> scores;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = scores[a];
    const float sb = scores[b];
    const bool na = std::isnan(sa);
    const bool nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
  }
};

}  // namespace

void PartitionTopPages(absl::Span<const float> scores, int32_t first, int32_t k,
                       std::vector<int32_t>* out) {
  CHECK(k >= 0 && first >= 0 && first <= k);
  const size_t n = scores.size();
  out->resize(n);
  std::iota(out->begin(), out->end(), 0);
  const Better better{scores};
  const size_t take = std::min<size_t>(static_cast<size_t>(k), n);
  const size_t set = std::min<size_t>(static_cast<size_t>(first), take);
  if (take < n) std::nth_element(out->begin(), out->begin() + take, out->end(), better);
  out->resize(take);
  if (set > 0 && set < take) std::nth_element(out->begin(), out->begin() + set, out->end(), better);
  std::sort(out->begin() + set, out->end(), better);
}

void RankTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  PartitionTopPages(scores, 0, k, out);
}

void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  RankTopPages(scores, k, out);
  std::sort(out->begin(), out->end());
}

}  // namespace specula
