// The data the host and the device share to turn rows of logits into tokens on the device: what
// each row is sampled with, and what comes back for it. One definition, included by the engine's
// sampler (engine/sampling/), both backends and the CUDA kernel (kernels/sampling.cu). Plain C++
// that includes nothing of the engine's.
//
// The method is the CPU sampler's (engine/sampling/row_sampling.h), so the device is exact
// against it for greedy and for a given uniform:
//   - greedy: the most likely token, the lowest id among equal logits;
//   - truncated (top-k, or top-p < 1): candidates ranked most likely first (ties: lower id), the
//     prefix kept by top-k, then the nucleus, then min-p, and an inverse-CDF draw over that
//     ranked prefix;
//   - untruncated (temperature alone, with or without min-p): an inverse-CDF draw over the tokens
//     in id order.
// Weights are exp((logit - max) / temperature), which makes the most likely token's exactly 1.
#pragma once

#include <cstdint>

namespace specula {

// Most alternatives a row may ask logprobs for (OpenAI's top_logprobs limit).
inline constexpr int32_t kMaxSampledAlternatives = 20;

// How one row of logits becomes a token. Penalties are the host's (the row's logits already
// carry them, or the request has none).
struct RowSampling {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  int32_t logprobs = -1;     // -1: none; 0: the chosen token's; N: and the N most likely
  int32_t reserved = 0;
  double uniform = 0.0;  // the row's draw in [0, 1), from its sequence's random stream
};

enum class RowSampleStatus : int32_t {
  kOk = 0,
  // A logit was NaN or +infinity, or none was finite: no token (the sequence fails, as on the
  // host). -infinity alone is a token never chosen (a grammar's mask), not an error.
  kNonFinite = 1,
};

// One row's result. Logprobs are log_softmax of the row's logits (temperature not applied).
struct SampledRow {
  int32_t token = 0;
  RowSampleStatus status = RowSampleStatus::kOk;
  float logprob = 0.0f;      // of `token`, when logprobs >= 0
  int32_t alternatives = 0;  // min(logprobs, vocab) when logprobs > 0, else 0
  int32_t alternative_tokens[kMaxSampledAlternatives] = {};  // most likely first
  float alternative_logprobs[kMaxSampledAlternatives] = {};
};

}  // namespace specula
