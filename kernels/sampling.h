// Sampling on the device: one token (and the logprobs asked for) per row of fp32 logits, by the
// method of kernels/sampling_abi.h, so only ids and logprobs cross the bus. Semantics are the
// CPU reference's (engine/sampling/row_sampling.h); tests/cuda/ compares the two.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sampling_abi.h"

namespace specula::kernels {

struct SampleRowsParams {
  const float* logits = nullptr;  // [rows, vocab], row stride `stride` floats
  int64_t rows = 0;
  int64_t vocab = 0;  // at most 2^24 (the fixed-point weights keep 40 bits below it)
  int64_t stride = 0;
  const RowSampling* sampling = nullptr;  // [rows]
  SampledRow* out = nullptr;              // [rows]
};
cudaError_t SampleRows(const SampleRowsParams& p, cudaStream_t stream);

}  // namespace specula::kernels
