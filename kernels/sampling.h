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

// A grammar's masks on the rows they belong to: logits[rows[i], t] = -inf where bit t % 32 of
// bits[i * words + t / 32] is clear (words = ceil(vocab / 32)), NaN and +inf left for SampleRows
// to report. One thread per token, so a warp reads one mask word and writes 128 contiguous
// bytes. Per masked row it reads vocab / 8 bytes and writes at most 4 * vocab.
struct MaskLogitsParams {
  float* logits = nullptr;  // [*, vocab], row stride `stride` floats
  int64_t vocab = 0;
  int64_t stride = 0;
  const int32_t* rows = nullptr;  // [masked_rows]: the logits row of each mask
  int64_t masked_rows = 0;
  const uint32_t* bits = nullptr;  // [masked_rows, words]
};
cudaError_t MaskLogits(const MaskLogitsParams& p, cudaStream_t stream);

}  // namespace specula::kernels
