#include "engine/common/dtype.h"

#include <algorithm>
#include <cmath>

namespace specula {

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&bits, &f, sizeof(bits));
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t FloatToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // overflow -> inf (incl. inf)
  if (abs < 0x38800000u) {                                // subnormal or zero in f16
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);   // round to nearest even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

void ConvertToF32(DType src_type, const void* src, float* dst, size_t n) {
  VisitDType(src_type, [&](auto tag) {
    using T = decltype(tag);
    // __restrict: without it the loop needs an alias check, and -O2 leaves it scalar.
    const T* __restrict s = static_cast<const T*>(src);
    float* __restrict d = dst;
    for (size_t i = 0; i < n; ++i) d[i] = ToF32(s[i]);
  });
}

void ConvertFromF32(DType dst_type, const float* src, void* dst, size_t n) {
  VisitDType(dst_type, [&](auto tag) {
    using T = decltype(tag);
    const float* __restrict s = src;
    T* __restrict d = static_cast<T*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = FromF32<T>(s[i]);
  });
}

void ConvertDType(DType src_type, const void* src, DType dst_type, void* dst, size_t n) {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * DTypeSize(src_type));
  } else if (dst_type == DType::kF32) {
    ConvertToF32(src_type, src, static_cast<float*>(dst), n);
  } else if (src_type == DType::kF32) {
    ConvertFromF32(dst_type, static_cast<const float*>(src), dst, n);
  } else {  // one half type to the other, a stack tile at a time
    constexpr size_t kTile = 512;
    float tile[kTile];
    const auto* s = static_cast<const std::byte*>(src);
    auto* d = static_cast<std::byte*>(dst);
    for (size_t i = 0; i < n; i += kTile) {
      const size_t m = std::min(kTile, n - i);
      ConvertToF32(src_type, s + i * DTypeSize(src_type), tile, m);
      ConvertFromF32(dst_type, tile, d + i * DTypeSize(dst_type), m);
    }
  }
}

}  // namespace specula
