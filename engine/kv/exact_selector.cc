#include "engine/kv/exact_selector.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "engine/common/check.h"

namespace specula {

ExactSelector::ExactSelector(const HostKvStore& store)
    : store_(store), tokens_(store.capacity_pages(), 0) {}

size_t ExactSelector::index_bytes_per_page() const {
  return static_cast<size_t>(store_.page_size()) * store_.head_dim() * DTypeSize(store_.dtype());
}

void ExactSelector::Summarize(PageId page, const float* /*k*/, int32_t tokens) {
  CHECK(page >= 0 && page < static_cast<PageId>(tokens_.size())) << "exact: page " << page;
  CHECK(tokens >= 1 && tokens <= store_.page_size()) << "exact: " << tokens << " tokens";
  tokens_[page] = tokens;
}

void ExactSelector::Score(absl::Span<const float> queries, int32_t group,
                          absl::Span<const PageId> pages, absl::Span<float> scores) const {
  const int32_t head_dim = store_.head_dim();
  CHECK_GE(group, 1);
  CHECK_EQ(queries.size(), static_cast<size_t>(group) * head_dim);
  CHECK_EQ(scores.size(), pages.size());
  // Keys in fp32 whatever the store's dtype; one buffer per call (Score runs on many threads).
  std::vector<float> keys(static_cast<size_t>(store_.page_size()) * head_dim);
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[i];
    CHECK(page >= 0 && page < static_cast<PageId>(tokens_.size()) && tokens_[page] > 0)
        << "exact: scoring page " << page << " that was never summarized";
    store_.ReadKeys(page, tokens_[page], keys.data());
    float best = -std::numeric_limits<float>::infinity();
    for (int32_t t = 0; t < tokens_[page]; ++t) {
      const float* k = keys.data() + static_cast<size_t>(t) * head_dim;
      for (int32_t h = 0; h < group; ++h) {
        const float* q = queries.data() + static_cast<size_t>(h) * head_dim;
        float dot = 0.0f;
        for (int32_t c = 0; c < head_dim; ++c) dot += q[c] * k[c];
        best = std::max(best, dot);
      }
    }
    scores[i] = best;
  }
}

}  // namespace specula
