#include "engine/kv/selection_index.h"

#include "absl/strings/str_format.h"

namespace specula {

absl::StatusOr<std::unique_ptr<SelectionIndex>> SelectionIndex::Create(std::string_view selector,
                                                                       Backend& backend,
                                                                       int32_t capacity_pages,
                                                                       int32_t head_dim) {
  auto index = std::make_unique<SelectionIndex>();
  index->head_dim_ = head_dim;
  if (selector == "exact") {
    index->scoring_ = PageScoring::kExact;
    return index;
  }
  if (selector != "quest") {
    return absl::InvalidArgumentError(
        absl::StrFormat("sparse.selector = '%s': unknown selector (quest|exact)", selector));
  }
  const size_t bytes = static_cast<size_t>(capacity_pages) * 2 * head_dim * sizeof(float);
  absl::StatusOr<DeviceBuffer> table = backend.Allocate(bytes);
  if (!table.ok()) {
    return absl::Status(table.status().code(),
                        absl::StrFormat("the quest selection index of %d host pages (%d bytes): %s",
                                        capacity_pages, bytes, table.status().message()));
  }
  index->table_ = std::move(*table);
  return index;
}

}  // namespace specula
