// The load generator of `specula-bench serve`: streams Generate calls to a server with the gRPC
// callback API (no thread per stream, so the client takes as little CPU as it can from a server
// that may share the machine) and records when each message arrived.
//
// Threading: RunLoad blocks its caller, which dispatches the requests; the records are written by
// gRPC's callback threads, each request's record by its own call only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "specula/v1/specula.grpc.pb.h"
#include "tools/bench/serve_stats.h"

namespace specula {

struct LoadPlan {
  std::vector<std::vector<int32_t>> prompts;  // one request each, sent in this order
  int32_t output_len = 128;                   // max_tokens, with ignore_eos and greedy sampling
  // Send offsets since the start (Poisson arrivals); empty sends each as soon as a slot is free.
  std::vector<double> arrival_offsets;
  int32_t max_concurrency = 0;  // most requests in flight; 0 = no cap
  double timeout_seconds = 0;   // per-request deadline; 0 = none
  std::vector<std::string> session_ids;  // one per prompt (GenerateRequest.session_id); or empty
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in prompt order
  double duration_seconds = 0;         // first send -> last stream finished
  double client_cpu_seconds = 0;       // user + system time of this process during the run
};

// Waits up to `timeout_seconds` for the channel to connect, then asks for the model.
absl::StatusOr<v1::ModelInfo> FetchModelInfo(const std::shared_ptr<grpc::Channel>& channel,
                                             double timeout_seconds);

LoadResult RunLoad(v1::Specula::Stub* stub, const LoadPlan& plan);

}  // namespace specula
