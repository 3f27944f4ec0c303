// The inner loops of the CPU attention and exact page scoring, over head_dim values of K or V
// stored as T (fp32, bf16 or f16) and converted on the fly.
//
// Written so that GCC vectorizes them at -O2: a dot product kept in one running sum is a chain of
// dependent adds the compiler may not reorder (that would change the result), so it ran one
// multiply-add per add latency; sixteen independent partial sums, added in a fixed order at the
// end, have no such chain. Deterministic: the same inputs give the same bits, on every path that
// uses them (dense and sparse attention stay bit-identical to each other).
#pragma once

#include <cstdint>

#include "engine/common/dtype.h"

namespace specula {

inline constexpr int32_t kDotLanes = 16;

template <typename T>
inline float Dot(const float* q, const T* k, int32_t n) {
  float lanes[kDotLanes] = {};
  int32_t c = 0;
  for (; c + kDotLanes <= n; c += kDotLanes) {
    for (int32_t l = 0; l < kDotLanes; ++l) lanes[l] += q[c + l] * ToF32(k[c + l]);
  }
  float sum = 0.0f;
  for (; c < n; ++c) sum += q[c] * ToF32(k[c]);
  for (int32_t l = 0; l < kDotLanes; ++l) sum += lanes[l];
  return sum;
}

// acc[c] += p * v[c] for c < n (acc and v do not overlap). In blocks of kDotLanes for the same
// reason: GCC's -O2 vectorizes a fixed-length inner loop, not one of unknown length.
template <typename T>
inline void AddScaled(float p, const T* __restrict v, float* __restrict acc, int32_t n) {
  int32_t c = 0;
  for (; c + kDotLanes <= n; c += kDotLanes) {
    for (int32_t l = 0; l < kDotLanes; ++l) acc[c + l] += p * ToF32(v[c + l]);
  }
  for (; c < n; ++c) acc[c] += p * ToF32(v[c]);
}

}  // namespace specula
