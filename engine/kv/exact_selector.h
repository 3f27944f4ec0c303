// The oracle selector: a page's score is the true maximum of q·k over its valid keys (and over a
// GQA group's query heads), read from the host store's K. It defines "the pages attention needs"
// for evaluation (attention recall, selector quality) and is far too costly to serve with: scoring
// reads every key of every page, so its "index" is K itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/page_selector.h"

namespace specula {

class ExactSelector : public PageSelector {
 public:
  // Keeps a reference to `store`, which must outlive the selector.
  explicit ExactSelector(const HostKvStore& store);

  std::string_view name() const override { return "exact"; }
  // Records only the valid-key count: `k` is not copied, scoring reads the store's K, so the
  // page's keys must be in the store (WriteToken) before Score.
  void Summarize(PageId page, const float* k, int32_t tokens) override;
  void Score(absl::Span<const float> queries, int32_t group, absl::Span<const PageId> pages,
             absl::Span<float> scores) const override;
  size_t index_bytes_per_page() const override;

 private:
  const HostKvStore& store_;
  std::vector<int32_t> tokens_;  // valid keys per page; 0 = never summarized
};

}  // namespace specula
