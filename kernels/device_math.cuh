// Device-side helpers shared by the kernels: storage types per DType (bf16/f16 storage, fp32
// compute, round to nearest even like the CPU backend), warp reductions and launch helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/common/ceil_div.h"
#include "engine/common/dtype.h"

namespace specula::kernels {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// Calls fn(T{}) with T the CUDA storage type of `t`, so a kernel is written once as a template.
template <typename Fn>
cudaError_t VisitStorageType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    case DType::kF16:
      return fn(__half{});
    case DType::kF32:
      return fn(float{});
  }
  return cudaErrorInvalidValue;
}

// The same dispatch inside a kernel.
template <typename Fn>
__device__ __forceinline__ void VisitStorageTypeOnDevice(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16:
      fn(__nv_bfloat16{});
      return;
    case DType::kF16:
      fn(__half{});
      return;
    case DType::kF32:
      break;
  }
  fn(float{});
}

// The values of one 16-byte load of T (4 fp32 or 8 bf16/f16), as fp32.

// Elements of T in one 16-byte load.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[4]) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}

template <typename T2, typename Convert>
__device__ __forceinline__ void UnpackPairs(const uint4& raw, float (&out)[8], Convert convert) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    T2 pair;
    static_assert(sizeof(pair) == sizeof(uint32_t));
    memcpy(&pair, &words[i], sizeof(pair));
    const float2 f = convert(pair);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <typename T>
__device__ __forceinline__ void UnpackAs(const uint4& raw, float (&out)[kVec<T>]) {
  if constexpr (sizeof(T) == 4) {
    Unpack(raw, out);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    UnpackPairs<__nv_bfloat162>(raw, out, [](__nv_bfloat162 p) { return __bfloat1622float2(p); });
  } else {
    UnpackPairs<__half2>(raw, out, [](__half2 p) { return __half22float2(p); });
  }
}

// Sum and minimum over the 32 lanes of a warp; every lane receives it.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMin(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The total of `v` over a block of kBlockThreads threads, added in a fixed order (a double sum is
// the same on every run); every thread receives it. `partial` (kBlockThreads / 32 values in
// shared memory) is free again on return.
template <int kBlockThreads, typename T>
__device__ T BlockSum(T v, T* partial) {
  v = WarpSum(v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kBlockThreads / 32; ++w) total += partial[w];
  __syncthreads();
  return total;
}

// Calls fn(r, c) for every cell of a rows x cols problem, in a grid-stride loop.
template <typename Fn>
__device__ __forceinline__ void ForEachCell(int64_t rows, int64_t cols, Fn fn) {
  const int64_t n = rows * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    fn(i / cols, i % cols);
  }
}

// Blocks of `threads` covering n items, capped at about a million blocks: ForEachCell's grid
// stride covers the rest, so a huge problem does not launch more blocks than it can use.
inline unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = CeilDiv(n, threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 16 ? 65535 * 16 : blocks));
}

// The launch's error (a bad configuration), or the sticky error of an earlier asynchronous
// failure; cudaSuccess otherwise.
inline cudaError_t LaunchStatus() { return cudaGetLastError(); }

}  // namespace specula::kernels
