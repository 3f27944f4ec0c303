#include "engine/kv/quest_selector.h"

#include <algorithm>
#include <limits>

#include "engine/common/check.h"

namespace specula {

QuestSelector::QuestSelector(const HostKvStore& store)
    : head_dim_(store.head_dim()),
      page_size_(store.page_size()),
      index_(static_cast<size_t>(store.capacity_pages()) * 2 * store.head_dim(), 0.0f),
      tokens_(store.capacity_pages(), 0) {}

absl::Span<const float> QuestSelector::summary(PageId page) const {
  CHECK(page >= 0 && page < static_cast<PageId>(tokens_.size())) << "quest: page " << page;
  return absl::MakeConstSpan(index_.data() + static_cast<size_t>(page) * 2 * head_dim_,
                             2 * head_dim_);
}

void QuestSelector::Summarize(PageId page, const float* k, int32_t tokens) {
  CHECK(page >= 0 && page < static_cast<PageId>(tokens_.size())) << "quest: page " << page;
  CHECK(tokens >= 1 && tokens <= page_size_) << "quest: " << tokens << " tokens";
  // Recomputed from all valid keys rather than folded in incrementally: a page reused after
  // release would otherwise keep its previous owner's bounds. The cost (page_size x head_dim)
  // is small next to the attention over the page.
  float* mn = index_.data() + static_cast<size_t>(page) * 2 * head_dim_;
  float* mx = mn + head_dim_;
  std::copy(k, k + head_dim_, mn);
  std::copy(k, k + head_dim_, mx);
  for (int32_t t = 1; t < tokens; ++t) {
    const float* row = k + static_cast<size_t>(t) * head_dim_;
    for (int32_t c = 0; c < head_dim_; ++c) {
      mn[c] = std::min(mn[c], row[c]);
      mx[c] = std::max(mx[c], row[c]);
    }
  }
  tokens_[page] = tokens;
}

void QuestSelector::Score(absl::Span<const float> queries, int32_t group,
                          absl::Span<const PageId> pages, absl::Span<float> scores) const {
  CHECK_GE(group, 1);
  CHECK_EQ(queries.size(), static_cast<size_t>(group) * head_dim_);
  CHECK_EQ(scores.size(), pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[i];
    CHECK(page >= 0 && page < static_cast<PageId>(tokens_.size()) && tokens_[page] > 0)
        << "quest: scoring page " << page << " that was never summarized";
    const float* mn = index_.data() + static_cast<size_t>(page) * 2 * head_dim_;
    const float* mx = mn + head_dim_;
    float best = -std::numeric_limits<float>::infinity();
    for (int32_t h = 0; h < group; ++h) {
      const float* q = queries.data() + static_cast<size_t>(h) * head_dim_;
      float bound = 0.0f;
      for (int32_t c = 0; c < head_dim_; ++c) bound += std::max(q[c] * mn[c], q[c] * mx[c]);
      best = std::max(best, bound);
    }
    scores[i] = best;
  }
}

}  // namespace specula
