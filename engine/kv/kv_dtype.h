// The element type of KV pages (`kv_cache.dtype`), the same in the host store and in device slots
// so a page moves between them as bytes. bf16 halves host memory and PCIe bytes per token against
// fp32; compute stays fp32 on every backend.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/common/dtype.h"

namespace specula {

// "auto" (the backend's preference: fp32 on the CPU reference backend, bf16 on a GPU), "bf16",
// "f16" or "f32". INVALID_ARGUMENT listing the accepted names otherwise.
absl::StatusOr<DType> ResolveKvDtype(std::string_view name, DType backend_default);

// "bf16", "f16" or "f32": the config spelling of a KV dtype.
std::string_view KvDtypeName(DType dtype);

}  // namespace specula
