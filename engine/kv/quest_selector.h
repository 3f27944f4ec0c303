// Quest page selection (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", 2024). A page's selection index is the per-channel min and max of its keys:
// 2 * head_dim floats, i.e. 2 / page_size of the page's K bytes. For a query q,
//   bound(q, page) = Σ_c max(q_c · min_c, q_c · max_c)
// is an upper bound of q·k for every key k in the page (each term bounds q_c · k_c), so a page
// holding a high-scoring key is never ranked below its true score. Over a GQA group the score is
// the max of the heads' bounds (see page_selector.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/page_selector.h"

namespace specula {

class QuestSelector : public PageSelector {
 public:
  // Sized for every page `store` can hold; summaries are indexed by PageId.
  explicit QuestSelector(const HostKvStore& store);

  std::string_view name() const override { return "quest"; }
  // Only the first `tokens` keys count, so a partial page's bound covers just its valid keys.
  void Summarize(PageId page, const float* k, int32_t tokens) override;
  void Score(absl::Span<const float> queries, int32_t group, absl::Span<const PageId> pages,
             absl::Span<float> scores) const override;
  size_t index_bytes_per_page() const override { return 2 * head_dim_ * sizeof(float); }

  // The whole index: every page of the store (what a device copy of it would take).
  size_t index_bytes() const { return index_.size() * sizeof(float); }
  // Page summary: min [head_dim] then max [head_dim].
  absl::Span<const float> summary(PageId page) const;

 private:
  int32_t head_dim_ = 0;
  int32_t page_size_ = 0;
  std::vector<float> index_;     // [page][min | max][head_dim]
  std::vector<int32_t> tokens_;  // keys summarized per page; 0 = never summarized
};

}  // namespace specula
