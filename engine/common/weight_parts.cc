#include "engine/common/weight_parts.h"

#include <algorithm>
#include <cstddef>

namespace specula {

int64_t TotalElements(absl::Span<const WeightPart> parts) {
  int64_t total = 0;
  for (const WeightPart& p : parts) total += p.numel;
  return total;
}

void ConvertWeightRange(absl::Span<const WeightPart> parts, int64_t begin, int64_t end,
                        DType dst_type, void* dst) {
  auto* out = static_cast<std::byte*>(dst);
  int64_t part_start = 0;  // index of the part's first element in the concatenation
  for (const WeightPart& p : parts) {
    const int64_t lo = std::max(begin, part_start);
    const int64_t hi = std::min(end, part_start + p.numel);
    if (lo < hi) {
      const auto* src = static_cast<const std::byte*>(p.data) +
                        static_cast<size_t>(lo - part_start) * DTypeSize(p.dtype);
      ConvertDType(p.dtype, src, dst_type, out + static_cast<size_t>(lo - begin) * DTypeSize(dst_type),
                   static_cast<size_t>(hi - lo));
    }
    part_start += p.numel;
    if (part_start >= end) break;
  }
}

}  // namespace specula
