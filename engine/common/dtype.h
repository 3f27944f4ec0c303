// Element types of weights, activations and KV pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace specula {

enum class DType : uint8_t { kF32, kF16, kBF16 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

inline std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

inline float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToFloat(uint16_t v);
uint16_t FloatToF16(float f);

// Converts `n` elements of type `src_type` to fp32.
void ConvertToF32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace specula
