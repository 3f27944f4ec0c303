#include "engine/sampling/sampling_params.h"

#include <cmath>
#include <cstddef>
#include <string_view>
#include <utility>

#include "absl/strings/str_format.h"

namespace specula {
namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 1024;

// Every range check below is phrased so that NaN fails it too, but a separate finiteness check
// gives the client a clearer message than "must be >= 0, got nan".
absl::Status CheckFinite(std::string_view field, float v) {
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.%s must be a finite number, got %g", field, v));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  const std::pair<std::string_view, float> floats[] = {
      {"temperature", p.temperature},
      {"top_p", p.top_p},
      {"min_p", p.min_p},
      {"repetition_penalty", p.repetition_penalty},
      {"frequency_penalty", p.frequency_penalty},
      {"presence_penalty", p.presence_penalty},
  };
  for (const auto& [field, v] : floats) {
    if (absl::Status s = CheckFinite(field, v); !s.ok()) return s;
  }
  if (p.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.temperature must be >= 0, got %g", p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.top_p must be in (0, 1], got %g", p.top_p));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.top_k must be >= 0 (0 = off), got %d", p.top_k));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.min_p must be in [0, 1], got %g", p.min_p));
  }
  if (!(p.repetition_penalty > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sampling.repetition_penalty must be > 0, got %g", p.repetition_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.frequency_penalty must be in [-2, 2], got %g", p.frequency_penalty));
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.presence_penalty must be in [-2, 2], got %g", p.presence_penalty));
  }
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sampling.logprobs must be in [-1, %d] (-1 = none), got %d", kMaxLogprobs, p.logprobs));
  }
  return absl::OkStatus();
}

absl::Status ValidateStoppingCriteria(const StoppingCriteria& s, int64_t vocab_size) {
  if (s.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stopping.max_tokens must be >= 1, got %d", s.max_tokens));
  }
  if (s.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stopping.stop has %d strings; at most %d are allowed", s.stop.size(), kMaxStopStrings));
  }
  for (size_t i = 0; i < s.stop.size(); ++i) {
    if (s.stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("stopping.stop[%d] must not be empty", i));
    }
    if (s.stop[i].size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stopping.stop[%d] is %d bytes long; at most %d bytes are allowed", i,
                          s.stop[i].size(), kMaxStopBytes));
    }
  }
  for (size_t i = 0; i < s.stop_token_ids.size(); ++i) {
    const int32_t id = s.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stopping.stop_token_ids[%d] must be in [0, %d) (the vocabulary), got %d",
                          i, vocab_size, id));
    }
  }
  return absl::OkStatus();
}

}  // namespace specula
