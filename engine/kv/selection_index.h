// The sparse cache's selection index (docs/SPARSE_KV.md): a small summary of every host page's
// keys, kept in backend (device) memory so pages are scored without touching host memory.
// Quest (the default) keeps per page and channel the min and max of K, fp32: 2 * head_dim floats
// a page, indexed by the page's id in the host store, so a page shared through the prefix cache
// keeps its summary. The `exact` selector keeps none: it scores with the page's keys themselves,
// read from the host store (the evaluation oracle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace specula {

class SelectionIndex {
 public:
  // `selector`: "quest" or "exact" (INVALID_ARGUMENT otherwise). RESOURCE_EXHAUSTED when the
  // table for `capacity_pages` pages does not fit the device.
  static absl::StatusOr<std::unique_ptr<SelectionIndex>> Create(std::string_view selector,
                                                                Backend& backend,
                                                                int32_t capacity_pages,
                                                                int32_t head_dim);

  PageScoring scoring() const { return scoring_; }
  std::string_view name() const { return scoring_ == PageScoring::kQuest ? "quest" : "exact"; }
  // The summary table [page][min | max][head_dim], or null for exact.
  float* summaries() const { return table_.as<float>(); }
  // Bytes of summary per page that scoring reads (exact reads the page's keys).
  size_t index_bytes_per_page(size_t key_bytes_per_page) const {
    return scoring_ == PageScoring::kQuest ? 2 * static_cast<size_t>(head_dim_) * sizeof(float)
                                           : key_bytes_per_page;
  }

 private:
  PageScoring scoring_ = PageScoring::kQuest;
  int32_t head_dim_ = 0;
  DeviceBuffer table_;
};

}  // namespace specula
