// Row-wise and element-wise kernels of the forward pass. Each launcher takes a plain params
// struct of raw device pointers (row-major fp32 matrices with a row stride in elements), enqueues
// on `stream` and returns the launch status. Semantics are the CPU backend's
// (engine/cpu/cpu_backend.cc); tests/cuda/ compares the two.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace specula::kernels {

// A row-major fp32 matrix in device memory.
struct Rows {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

// out[i] = table[ids[i]] converted to fp32; table [vocab, dim] of `table_dtype`.
struct EmbedParams {
  const int32_t* ids = nullptr;
  const void* table = nullptr;
  DType table_dtype = DType::kF32;
  int64_t vocab = 0;
  Rows out;  // [ids, dim]
};
cudaError_t Embed(const EmbedParams& p, cudaStream_t stream);

// y[r] = x[r] / rms(x[r]) * weight (fp32 weight [cols]); y may alias x. Two fused forms:
// - `residual` set: first x[r] += residual[r] (written back to x), then the norm of the sum;
//   y may alias x or residual.
// - `heads` > 1: each row holds `heads` vectors of x.cols elements, x.cols apart, each normed on
//   its own (Qwen3's per-head q/k norm): vector h of row r is at x.data + r * x.stride +
//   h * x.cols, and likewise in y.
// Not both: cudaErrorInvalidValue.
struct RmsNormParams {
  Rows x;
  Rows y;
  const float* weight = nullptr;
  float eps = 0;
  Rows residual;  // data null: none
  int32_t heads = 1;
};
cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream);

// In place, rotate-half RoPE of each head of each row at positions[row] with angles
// position * inv_freq[i] (computed in double, as on the CPU), i < head_dim / 2.
struct RopeParams {
  Rows x;  // [tokens, num_heads * head_dim]
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
};
cudaError_t Rope(const RopeParams& p, cudaStream_t stream);

// out = silu(gate_up[:, :n]) * gate_up[:, n:], n = out.cols.
struct SwiGluParams {
  Rows gate_up;
  Rows out;
};
cudaError_t SwiGlu(const SwiGluParams& p, cudaStream_t stream);

// x += y (same shape).
struct AddParams {
  Rows x;
  Rows y;
};
cudaError_t Add(const AddParams& p, cudaStream_t stream);

// y[r] += bias (fp32 [cols]).
struct AddBiasParams {
  Rows y;
  const float* bias = nullptr;
};
cudaError_t AddBias(const AddBiasParams& p, cudaStream_t stream);

// out[i] = src[rows[i]], i < out.rows.
struct GatherRowsParams {
  Rows src;
  const int32_t* rows = nullptr;
  Rows out;
};
cudaError_t GatherRows(const GatherRowsParams& p, cudaStream_t stream);

// out (contiguous [x.rows, x.cols] bf16) = x rounded to nearest even: a GEMM's input.
struct ToBf16Params {
  Rows x;
  void* out = nullptr;
};
cudaError_t ToBf16(const ToBf16Params& p, cudaStream_t stream);

}  // namespace specula::kernels
