#include "kernels/device_math.cuh"
#include "kernels/skinny_gemm.h"

namespace specula::kernels {
namespace {

constexpr int kWarps = 8;
// 16-byte weight loads each lane issues before it uses any: 2 KB a warp in flight.
constexpr int kLoadsInFlight = 4;

// grid ceil(out / kWarps), kWarps warps: warp w of block b computes output column b * kWarps + w.
// Lane l takes the 8-element chunks l, l + 32, ... of the weight row and of x.
__global__ void __launch_bounds__(kWarps * 32) SkinnyGemmKernel(SkinnyGemmParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= p.out) return;  // the whole warp
  const auto* w_row =
      reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w) + o * p.in);
  const int32_t chunks = p.in / 8;
  float acc = 0.0f;
  for (int32_t c0 = lane; c0 < chunks; c0 += 32 * kLoadsInFlight) {
    uint4 raw[kLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int32_t c = c0 + 32 * i;
      raw[i] = c < chunks ? __ldg(w_row + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int32_t c = c0 + 32 * i;
      if (c >= chunks) break;
      float w[8];
      UnpackAs<__nv_bfloat16>(raw[i], w);
      const float4 a = *reinterpret_cast<const float4*>(p.x + 8 * c);
      const float4 b = *reinterpret_cast<const float4*>(p.x + 8 * c + 4);
      acc += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
             w[6] * b.z + w[7] * b.w;
    }
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
  SkinnyGemmKernel<<<static_cast<unsigned>(CeilDiv(p.out, kWarps)), kWarps * 32, 0, stream>>>(p);
  return LaunchStatus();
}

}  // namespace specula::kernels
