// A model weight as the checkpoint holds it: one or more tensors (Q, K and V; gate and up)
// concatenated along the output dimension, each in its own dtype. Backends convert these
// straight into their weight format, so no fp32 copy of the model is ever made on the host.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/common/dtype.h"

namespace specula {

struct WeightPart {
  DType dtype = DType::kF32;
  const void* data = nullptr;  // `numel` elements of `dtype`, e.g. in a mapped checkpoint
  int64_t numel = 0;
};

int64_t TotalElements(absl::Span<const WeightPart> parts);

// Converts elements [begin, end) of the concatenation of `parts` to `dst_type`, writing them to
// dst[0, end - begin). Disjoint ranges may be converted from several threads at once.
void ConvertWeightRange(absl::Span<const WeightPart> parts, int64_t begin, int64_t end,
                        DType dst_type, void* dst);

}  // namespace specula
