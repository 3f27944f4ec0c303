// `specula-bench constrained`: what structured outputs cost a batch end to end on the engine
// (issue 38: output tokens/s at batch 32 with and without constraints within 5%). Keeps `batch`
// requests in flight on the model of --model (a request that ends is replaced at once, so the
// batch stays full), and times a fixed number of steps, alternating runs where every request is
// free and runs where every request follows one of --schemas' JSON schemas (strict), in pairs.
#pragma once

#include <string>

#include "engine/common/device_kind.h"

namespace specula {

struct ConstrainedBenchOptions {
  std::string model_dir;     // a model with a real tokenizer (masks cost with the vocabulary)
  std::string schemas_file;  // a JSON array of {"schema": ..., "strict": bool}
  int batch = 32;
  int steps = 100;  // timed per run, after the batch is full and prefilled
  int pairs = 5;    // free/constrained runs, alternated
  int threads = 0;  // the CPU backend's; 0 = all cores
  DeviceKind device = DeviceKind::kCpu;
  // Of every request; at 1 a random-weight model's answers wander (as the grammar bench's random
  // walks do); at 0 sampling costs an argmax and the masks stand out.
  float temperature = 1.0f;
  // A request with a grammar new to the generator waits for its mask cache's preparation, as on
  // the engine (false: it starts at once, and its steps build the cache).
  bool prepare = true;
};

// Prints each run and the median ratio to stdout; returns a process exit code.
int RunConstrainedBench(const ConstrainedBenchOptions& options);

}  // namespace specula
