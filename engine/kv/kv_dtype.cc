#include "engine/kv/kv_dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace specula {

absl::StatusOr<DType> ResolveKvDtype(std::string_view name, DType backend_default) {
  if (name == "auto") return backend_default;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    if (name == KvDtypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype '", std::string(name),
                                                 "' (accepted: auto, bf16, f16, f32)"));
}

std::string_view KvDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      break;
  }
  return "f32";
}

}  // namespace specula
