// y = x · Wᵀ (+ bias) for 2 to 16 rows of x (decode steps of a few sequences) on the tensor cores.
// Like the one-row kernel (skinny_gemm.h) it reads every weight once, so bandwidth is what
// matters; unlike it, each weight is used by every row, so the rows must share each weight load:
// W is the MMA's A operand (16 output columns of a tile by 16 k) and xᵀ its B operand (k by the 8
// rows, padded; a second 8-row tile past 8 rows), m16n8k16 bf16 with fp32 accumulation ("swap A
// and B" for skinny GEMMs).
//
// Each lane loads 16 contiguous bytes of a weight row and of an x row (8 k's) and uses them for
// two k16 steps under one fixed permutation of k, the same for W and x, so no fragment shuffles
// are needed. A block's 16 warps split the k range of its column tiles (one or two tiles of 16
// columns) and reduce in shared memory in a fixed order: the result does not depend on timing.
// x is bf16 (the backend's rounded copy, as cuBLAS reads it), so the error is that of bf16
// inputs, as for cuBLAS. A dependent launch (dependent_launch.cuh): the first weight loads go out
// before it waits for the kernel ahead.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::kernels {

struct FewRowGemmParams {
  const void* x = nullptr;      // bf16 [m, in], rows packed (stride in)
  const void* w = nullptr;      // bf16 [out, in], row-major
  const float* bias = nullptr;  // [out], or null
  float* y = nullptr;           // [m, out], rows y_stride apart
  int64_t y_stride = 0;
  int32_t m = 0;
  int32_t in = 0;
  int32_t out = 0;
  int32_t sm_count = 1;  // picks the columns a block takes
};

// The most rows the kernel serves (two n8 MMA tiles).
constexpr int32_t kFewRowGemmMaxRows = 16;

// Whether the kernel serves the shape: 2..16 rows, `in` a multiple of 32, x and w 16-byte aligned.
bool FewRowGemmSupports(const FewRowGemmParams& p);

cudaError_t FewRowGemm(const FewRowGemmParams& p, cudaStream_t stream);

}  // namespace specula::kernels
