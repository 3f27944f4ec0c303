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
#include "engine/sampling/row_sampling.h"
#include "engine/sampling/sampling_params.h"

namespace specula {

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;           // of the chosen token (only when params.logprobs >= 0)
  std::vector<TokenLogprob> top;  // top-N alternatives, most likely first
};

class Sampler {
 public:
  // `params` must have passed ValidateSamplingParams. `prompt` feeds the repetition penalty.
  // Without a seed, the RNG is seeded from std::random_device.
  Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt);

  // `logits` (vocab_size floats) may be modified in place: on return they hold the penalized
  // logits (temperature is not applied in place). Records the chosen token for the penalties of
  // later steps. Logprobs are those of the model's distribution (log_softmax of the raw logits,
  // before penalties and temperature), as vLLM reports by default.
  SampledToken Sample(absl::Span<float> logits);

  // Sampling on the device (Backend::SampleRows): possible unless a penalty is on (penalties
  // need the token counts, which live here). NextRow gives the next step's settings, drawing its
  // uniform from this sequence's stream as Sample would; Record takes the device's result.
  bool has_penalties() const;
  RowSampling NextRow();
  SampledToken Record(const SampledRow& row);

 private:
  using Candidate = sampling_internal::Candidate;

  // Applies the repetition, frequency and presence penalties. When `saved` is non-null, the raw
  // value of every logit it changes is appended there first (for the chosen token's logprob).
  void ApplyPenalties(absl::Span<float> logits, std::vector<Candidate>* saved) const;
  // Uniform double in [0, 1) built from 53 RNG bits, identical on every standard library.
  double NextUniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> prompt_tokens_;                  // distinct prompt tokens, sorted
  std::unordered_map<int32_t, int32_t> output_counts_;  // generated token -> count
  // Scratch reused across steps so a step allocates nothing in the steady state.
  RowSampler row_sampler_;
  std::vector<Candidate> saved_logits_;
};

}  // namespace specula
