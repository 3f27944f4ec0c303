// The request most engine tests use: greedy, EOS ignored, so its output is exactly
// `max_tokens` long and reproducible.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/generate/sequence.h"

namespace specula::testing {

inline GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.stopping.max_tokens = max_tokens;
  r.stopping.ignore_eos = true;
  return r;
}

}  // namespace specula::testing
