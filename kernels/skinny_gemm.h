// y = x · Wᵀ (+ bias) for one row of x: a batch-1 decode step's GEMMs, which read every weight
// once and so are bound by HBM bandwidth, not arithmetic. One warp per output column reads its
// bf16 weight row with 16-byte loads, 8 in flight per lane, against x read in fp32 as it is (no
// bf16 copy of x to make first, as cuBLAS needs; more exact too); fp32 accumulation. On sm_90 it
// is a programmatic dependent launch (kernels/dependent_launch.cuh): its first weight loads
// overlap the end of the kernel that makes x.
//
// One row only, by measurement (H200, docs/BENCHMARKS.md 2026-11-27): with more rows each 16
// bytes of weights cost 32 bytes of x loads per row from L1, which then sets the pace (8 rows:
// batch-8 decode fell from 4,168 to 2,101 tok/s against cuBLAS); a warp taking 2-4 columns, to
// reuse x, still lost to cuBLAS at 8 rows and was 9% slower at one. Tensor-core MMA over the
// padded rows is the way to serve 2-16 rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::kernels {

struct SkinnyGemmParams {
  const float* x = nullptr;     // [m, in]
  const void* w = nullptr;      // bf16 [out, in], row-major
  const float* bias = nullptr;  // [out], or null
  float* y = nullptr;           // [m, out]
  int32_t m = 0;
  int32_t in = 0;
  int32_t out = 0;
};

// Whether the kernel serves the shape: one row, `in` a multiple of 8, x and w 16-byte aligned
// (the weights' rows then are too).
bool SkinnyGemmSupports(const SkinnyGemmParams& p);

cudaError_t SkinnyGemm(const SkinnyGemmParams& p, cudaStream_t stream);

}  // namespace specula::kernels
