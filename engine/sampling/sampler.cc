#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cstdint>

namespace specula {

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt)
    : params_(params), prompt_tokens_(prompt.begin(), prompt.end()) {
  if (params_.seed.has_value()) {
    rng_.seed(*params_.seed);
  } else {
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd()));
  }
  std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
  prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                       prompt_tokens_.end());
}

double Sampler::NextUniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::ApplyPenalties(absl::Span<float> logits, std::vector<Candidate>* saved) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const float rep = params_.repetition_penalty;
  const bool repetition = rep != 1.0f;
  if (repetition) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = logits[t];
      if (saved != nullptr) saved->push_back({l, t});
      l = l > 0.0f ? l / rep : l * rep;
    };
    for (int32_t t : prompt_tokens_) penalize(t);
    // A token both in the prompt and generated is penalized once, as in HF.
    for (const auto& [t, count] : output_counts_) {
      if (!std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), t)) penalize(t);
    }
  }
  const float freq = params_.frequency_penalty;
  const float presence = params_.presence_penalty;
  if (freq != 0.0f || presence != 0.0f) {
    for (const auto& [t, count] : output_counts_) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[t];
      // With the repetition penalty on, every generated token was already saved above.
      if (saved != nullptr && !repetition) saved->push_back({l, t});
      l -= static_cast<float>(count) * freq + presence;
    }
  }
}

SampledToken Sampler::Sample(absl::Span<float> logits) {
  SampledToken out;
  const bool want_logprobs = params_.logprobs >= 0;
  float log_z = 0.0f;
  if (want_logprobs) {
    log_z = RowSampler::LogSumExp(logits);
    row_sampler_.TopLogprobs(logits, params_.logprobs, log_z, &out.top);
  }

  saved_logits_.clear();
  ApplyPenalties(logits, want_logprobs ? &saved_logits_ : nullptr);

  const int32_t token = row_sampler_.Choose(NextRow(), logits);

  if (want_logprobs && !logits.empty()) {
    float raw = logits[token];
    for (const Candidate& s : saved_logits_) {
      if (s.token == token) {
        raw = s.value;
        break;
      }
    }
    out.logprob = raw - log_z;
  }
  out.token = token;
  ++output_counts_[token];
  return out;
}

bool Sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
         params_.presence_penalty != 0.0f;
}

RowSampling Sampler::NextRow() {
  RowSampling row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.logprobs = params_.logprobs;
  // One draw per stochastic step, made whether or not the row ends up needing it, so the stream
  // a seed gives is the same on the host and on the device.
  if (row.temperature > 0.0f) row.uniform = NextUniform();
  return row;
}

SampledToken Sampler::Record(const SampledRow& row) {
  SampledToken out;
  out.token = row.token;
  out.logprob = row.logprob;
  out.top.reserve(static_cast<size_t>(row.alternatives));
  for (int32_t i = 0; i < row.alternatives; ++i) {
    out.top.push_back({row.alternative_tokens[i], row.alternative_logprobs[i]});
  }
  ++output_counts_[row.token];
  return out;
}

}  // namespace specula
