#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/skinny_gemm.h"

namespace specula::kernels {
namespace {

constexpr int kWarps = 8;
// 16-byte weight loads each lane issues before it uses any: 4 KB a warp in flight, a whole
// 2048-wide bf16 row, so the small projections of a 1B-class model (out 2-3K: 2-3 blocks an SM)
// still keep ~64 KB an SM in flight.
constexpr int kLoadsInFlight = 8;

using WeightChunks = uint4[kLoadsInFlight];

// The lane's chunks c0, c0 + 32, ... (kLoadsInFlight of them) of a weight row; 0 past its end.
__device__ __forceinline__ void LoadChunks(const uint4* w_row, int32_t c0, int32_t chunks,
                                           WeightChunks& raw) {
#pragma unroll
  for (int i = 0; i < kLoadsInFlight; ++i) {
    const int32_t c = c0 + 32 * i;
    raw[i] = c < chunks ? __ldg(w_row + c) : make_uint4(0, 0, 0, 0);
  }
}

// acc += those chunks · the matching 8-element chunks of x, in chunk order.
__device__ __forceinline__ void AccumulateChunks(const float* x, int32_t c0, int32_t chunks,
                                                 const WeightChunks& raw, float& acc) {
#pragma unroll
  for (int i = 0; i < kLoadsInFlight; ++i) {
    const int32_t c = c0 + 32 * i;
    if (c >= chunks) break;
    float w[8];
    UnpackAs<__nv_bfloat16>(raw[i], w);
    const float4 a = *reinterpret_cast<const float4*>(x + 8 * c);
    const float4 b = *reinterpret_cast<const float4*>(x + 8 * c + 4);
    acc += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
           w[6] * b.z + w[7] * b.w;
  }
}

// grid ceil(out / kWarps), kWarps warps: warp w of block b computes output column b * kWarps + w.
// Lane l takes the 8-element chunks l, l + 32, ... of the weight row and of x. Launched as a
// dependent launch: the weights never depend on the kernel ahead (the norm, SwiGLU or attention
// that makes x), so the first loads of the row go out before waiting for it; x and y are touched
// only after.
__global__ void __launch_bounds__(kWarps * 32) SkinnyGemmKernel(SkinnyGemmParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const bool active = o < p.out;
  const int32_t chunks = active ? p.in / 8 : 0;  // a warp past the last column loads nothing
  const auto* w_row = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w) +
                                                     (active ? o : 0) * p.in);
  WeightChunks raw;
  LoadChunks(w_row, lane, chunks, raw);
  WaitForPriorGrids();
  AllowDependentLaunch();
  if (!active) return;  // the whole warp
  float acc = 0.0f;
  AccumulateChunks(p.x, lane, chunks, raw, acc);
  for (int32_t c0 = lane + 32 * kLoadsInFlight; c0 < chunks; c0 += 32 * kLoadsInFlight) {
    LoadChunks(w_row, c0, chunks, raw);
    AccumulateChunks(p.x, c0, chunks, raw, acc);
  }
  const float total = WarpSum(acc);
  if (lane == 0) p.y[o] = total + (p.bias != nullptr ? p.bias[o] : 0.0f);
}

}  // namespace

bool SkinnyGemmSupports(const SkinnyGemmParams& p) {
  return p.m == 1 && p.in % 8 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

cudaError_t SkinnyGemm(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (!SkinnyGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.out == 0) return cudaSuccess;
  return LaunchDependent<SkinnyGemmKernel>(dim3(static_cast<unsigned>(CeilDiv(p.out, kWarps))),
                                           dim3(kWarps * 32), 0, stream, p);
}

}  // namespace specula::kernels
