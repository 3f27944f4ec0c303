// The statistics of `specula-bench serve`: per-request timings of a streamed run reduced to the
// figures `vllm bench serve` reports (TTFT, TPOT, ITL, E2E), plus the seeded workload (random
// prompts, Poisson arrivals). Pure code, no gRPC, so it is unit-tested on its own.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace specula {

// numpy.percentile's default ("linear"): rank p/100 * (n-1), interpolated between neighbours, so
// the figures compare with vllm's. `sorted` ascending and non-empty; p in [0, 100].
double Percentile(const std::vector<double>& sorted, double p);

// The middle value (the upper one of the two middles for an even count), as the sparse and
// agent benches report a timing's median. `values` non-empty.
double Median(std::vector<double> values);

struct Distribution {
  size_t count = 0;  // 0: no samples, every figure below is 0
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};
Distribution Summarize(std::vector<double> values);

// One streamed message that carried tokens; `seconds` since the request was sent.
struct StreamMessage {
  double seconds = 0;
  int32_t tokens = 0;
};

// What the client saw of one request.
struct RequestRecord {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // of them, reused from the server's cache (its usage)
  double start_seconds = 0;  // when it was sent, since the run started
  double e2e_seconds = 0;    // sent -> stream finished
  bool ok = false;
  int32_t status_code = 0;  // gRPC status code (the same numbering as absl::StatusCode)
  std::string error;
  int32_t empty_messages = 0;  // messages without tokens (the finish-only last message)
  std::vector<StreamMessage> messages;

  int64_t output_tokens() const;
  // The first message with tokens; 0 when there is none.
  double ttft_seconds() const;
};

// Inter-token latencies of one stream: each gap between consecutive messages is split evenly over
// the tokens the later message carried (a message of k tokens after a gap g gives k samples of
// g/k), so coalesced messages neither hide tokens nor show up as one huge gap. The extra tokens
// of the first message arrived with the first token and give no sample (TTFT covers them).
void AppendInterTokenLatencies(const std::vector<StreamMessage>& messages,
                               std::vector<double>* out);

struct BenchSummary {
  int64_t completed = 0;
  int64_t failed = 0;
  std::map<std::string, int64_t> failures_by_code;  // "RESOURCE_EXHAUSTED" -> count
  double duration_seconds = 0;
  int64_t input_tokens = 0;   // over completed requests
  int64_t cached_input_tokens = 0;  // of them, reused from the server's cache
  int64_t output_tokens = 0;  // over completed requests
  int64_t messages = 0;       // token-carrying messages over completed requests
  double request_throughput = 0;
  double output_throughput = 0;  // tokens/s
  double total_throughput = 0;   // (input + output) tokens/s
  double messages_per_token = 0;
  // In seconds. TPOT per request: (e2e - ttft) / (n - 1), requests with n >= 2 only.
  Distribution ttft, tpot, itl, e2e;
};
BenchSummary SummarizeRun(const std::vector<RequestRecord>& records, double duration_seconds);

// Seeded exponential gaps with mean 1/rate: Poisson arrivals. Rate infinity gives all-zero gaps.
// The inverse-CDF transform over mt19937_64 (whose output the standard fixes) keeps a seed's gaps
// the same across standard libraries, which std::exponential_distribution does not promise.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_second, uint64_t seed);
  double NextGapSeconds();

 private:
  double rate_;
  std::mt19937_64 rng_;
};

// Send offsets since the run's start for n requests: the running sum of the gaps.
std::vector<double> ArrivalOffsets(int n, double rate_per_second, uint64_t seed);

// n prompts of `length` token ids uniform in [1, vocab_size): id 0 is often a special token.
std::vector<std::vector<int32_t>> RandomPrompts(int n, int length, int32_t vocab_size,
                                                uint64_t seed);

}  // namespace specula
