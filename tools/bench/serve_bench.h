// `specula-bench serve`: load a running specula-server like `vllm bench serve` does (random
// token-id prompts, closed-loop concurrency or Poisson arrivals) and report throughput and
// streaming latencies; with compare_engine, replay the same requests through the in-process
// engine to measure what share of its throughput the server delivers.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace specula {

struct ServeBenchOptions {
  std::string server = "127.0.0.1:50051";
  int32_t num_prompts = 200;
  int32_t input_len = 128;
  int32_t output_len = 128;
  uint64_t seed = 0;
  // Closed loop when > 0: this many clients, each sending its next request when one ends.
  int32_t concurrency = 0;
  // Otherwise Poisson arrivals at this rate (req/s); infinity sends everything at once.
  double request_rate = std::numeric_limits<double>::infinity();
  int32_t max_concurrency = 0;  // cap for the Poisson mode; 0 = none
  int32_t warmup = 0;           // requests before the measured run, not counted
  double timeout_seconds = 0;   // per request; 0 = none
  std::string json_path;
  bool compare_engine = false;
  std::string model_dir;  // for compare_engine; "" = the embedded default model
  int32_t threads = 0;    // the engine baseline's CPU threads, 0 = all cores (as the server)
  int server_pid = 0;     // a local server's pid: report its CPU per thread name; 0 = don't
  // > 0: each prompt is first sent once under its own session_id with max_tokens 1 (all at once,
  // not measured); the measured requests are those sessions' next turns, the prompt and this
  // many new tokens, so the server reuses each session's KV (the agent pattern: a long cached
  // context and a short new input). 0: no sessions.
  int32_t session_suffix_len = 0;
};

// Prints the report to stdout; returns a process exit code: 0 when the run completed (failed
// requests are a result, counted by status code), 1 when none completed or setup failed.
int RunServeBench(const ServeBenchOptions& options);

}  // namespace specula
