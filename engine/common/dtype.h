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
// Converts `n` fp32 values to `dst_type` (round to nearest even).
void ConvertFromF32(DType dst_type, const float* src, void* dst, size_t n);
// Converts `n` elements of `src_type` to `dst_type`: a copy when the types are equal, otherwise
// through fp32 (exact for a half type to fp32; round to nearest even towards a half type).
void ConvertDType(DType src_type, const void* src, DType dst_type, void* dst, size_t n);

// Element types for code templated on the storage type (bf16/f16 storage, fp32 compute). Both
// half types are 16 bits, so they are distinct structs rather than uint16_t.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
inline float ToF32(float v) { return v; }
inline float ToF32(Bf16 v) { return Bf16ToFloat(v.bits); }
inline float ToF32(F16 v) { return F16ToFloat(v.bits); }
template <typename T>
T FromF32(float v);
template <>
inline float FromF32<float>(float v) {
  return v;
}
template <>
inline Bf16 FromF32<Bf16>(float v) {
  return Bf16{FloatToBf16(v)};
}
template <>
inline F16 FromF32<F16>(float v) {
  return F16{FloatToF16(v)};
}

// Calls fn(T{}) with T the storage type of `t` (float, Bf16 or F16), so a kernel is written
// once as a template and dispatched on a runtime dtype.
template <typename Fn>
decltype(auto) VisitDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16:
      return fn(Bf16{});
    case DType::kF16:
      return fn(F16{});
    case DType::kF32:
      break;
  }
  return fn(float{});
}

}  // namespace specula
