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

// Prompts around page boundaries (page 16): shorter than a page, exactly pages, and long enough
// that pages leave a 32-token recent window during prefill and during decode; 40 tokens each.
inline std::vector<GenerationRequest> PageBoundaryRequests(int logprobs) {
  std::vector<GenerationRequest> reqs;
  for (int len : {5, 64, 131}) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < len; ++j) prompt.push_back(1 + (len * 17 + j * 29) % 300);
    GenerationRequest r = Greedy(prompt, 40);
    r.sampling.logprobs = logprobs;
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace specula::testing
