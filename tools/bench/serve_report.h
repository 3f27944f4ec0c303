// Output of `specula-bench serve`: a vllm-style text report on stdout and the full results as
// JSON (settings, summary, engine baseline and every request's message timings).
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "tools/bench/serve_client.h"
#include "tools/bench/serve_engine.h"
#include "tools/bench/serve_stats.h"

namespace specula {

// The settings as run, for the report and the JSON; strings as given on the command line.
struct ServeRunInfo {
  std::string server;
  std::string model;    // ModelInfo.model_path, architecture and layers
  std::string arrival;  // "closed loop, concurrency 64" or "Poisson 20 req/s, max concurrency 64"
  int32_t num_prompts = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;
  uint64_t seed = 0;
  int32_t warmup = 0;
  int32_t session_suffix_len = 0;  // > 0: second turns of sessions (ServeBenchOptions)
  int32_t engine_max_running = 0;  // the batch the engine baseline runs at
  // With --server-pid: the server's CPU seconds during the measured run, per thread name.
  std::map<std::string, double> server_cpu_by_thread;
};

void PrintReport(const ServeRunInfo& info, const LoadResult& load, const BenchSummary& summary,
                 const std::optional<EngineBaseline>& engine, std::ostream& out);

absl::Status WriteJson(const std::string& path, const ServeRunInfo& info, const LoadResult& load,
                       const BenchSummary& summary, const std::optional<EngineBaseline>& engine);

}  // namespace specula
