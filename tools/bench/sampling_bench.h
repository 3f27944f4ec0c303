// `specula-bench sampling`: turning a step's logits into tokens, on the device (the Backend's
// SampleRows) against what serving does without it (the logits copied to the host, then sampled
// row by row there), for a vocabulary of `vocab` (Llama 3's by default), at each row count and
// for greedy, plain temperature, top-p, top-k and logprobs settings. Reports the median time of
// each, per step and per row.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/device_kind.h"

namespace specula {

struct SamplingBenchOptions {
  DeviceKind device = DeviceKind::kCuda;
  int64_t vocab = 128256;
  std::vector<int> rows = {1, 8, 64, 128};
  int repeats = 15;
};

// Prints a Markdown table to stdout; returns a process exit code.
int RunSamplingBench(const SamplingBenchOptions& options);

}  // namespace specula
