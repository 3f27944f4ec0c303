// Per-request sampling and stopping parameters, validated before a request is admitted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/sampling_abi.h"

namespace specula {

// Most top alternatives a request may ask logprobs for.
inline constexpr int32_t kMaxLogprobs = kMaxSampledAlternatives;

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // 0 = off
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (HF semantics, prompt + generated tokens)
  float frequency_penalty = 0.0f;   // [-2, 2] (OpenAI semantics, generated tokens)
  float presence_penalty = 0.0f;    // [-2, 2]
  std::optional<uint64_t> seed;     // same seed => same output
  int32_t logprobs = -1;            // -1 = none; N >= 0: chosen token's logprob + top N (N <= 20)
};

struct StoppingCriteria {
  int32_t max_tokens = 256;             // >= 1
  std::vector<std::string> stop;        // stop strings: matched on text, not emitted
  std::vector<int32_t> stop_token_ids;  // each < vocab_size
  bool ignore_eos = false;
};

// INVALID_ARGUMENT naming the field (e.g. "sampling.top_p must be in (0, 1], got 1.5") for NaN,
// infinities and out-of-range values.
absl::Status ValidateSamplingParams(const SamplingParams& p);
absl::Status ValidateStoppingCriteria(const StoppingCriteria& s, int64_t vocab_size);

}  // namespace specula
