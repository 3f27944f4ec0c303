// Turns one row of logits into a token, for one sequence. One Sampler per sequence (it owns the
// sequence's RNG and token counts); not thread-safe, but different sequences' samplers may run on
// different threads.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/sampling/sampling_params.h"

namespace specula {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;             // of the chosen token (only when params.logprobs >= 0)
  std::vector<TokenLogprob> top;    // top-N alternatives, most likely first
};

class Sampler {
 public:
  // `params` must have passed ValidateSamplingParams. `prompt` feeds the repetition penalty.
  // Without a seed, the RNG is seeded from std::random_device.
  Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt);

  // `logits` (vocab_size floats) may be modified in place. Records the chosen token for the
  // penalties of later steps. Logprobs are those of the model's distribution (log_softmax of the
  // raw logits, before penalties and temperature), as vLLM reports by default.
  SampledToken Sample(absl::Span<float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> prompt_tokens_;             // distinct prompt tokens
  std::unordered_map<int32_t, int32_t> output_counts_;  // generated token -> count
};

}  // namespace specula
