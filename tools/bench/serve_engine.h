// `specula-bench serve --compare-engine`: the served run's requests replayed in-process through
// the Generator, closed loop at the same batch, so that served tokens/s over engine tokens/s is
// the share of the engine's throughput the server delivers (the rest is gRPC, threads, queues).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/generate/generator.h"

namespace specula {

// What the server said it serves; the baseline refuses a model that does not match.
struct ExpectedModel {
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
};

struct EngineBaseline {
  double load_seconds = 0;
  double duration_seconds = 0;  // first Add -> last output
  double cpu_seconds = 0;       // user + system time of this process meanwhile
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t steps = 0;
  double mean_decode_rows = 0;  // decode rows per step: the batch actually run
  double output_throughput = 0;
};

// Runs every prompt to `output_len` tokens (greedy, ignore_eos), keeping up to
// options.max_running sequences in flight as the server's scheduler does.
absl::StatusOr<EngineBaseline> RunEngineBaseline(const std::string& model_dir,
                                                 const GeneratorOptions& options,
                                                 const ExpectedModel& expected,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int32_t output_len);

}  // namespace specula
