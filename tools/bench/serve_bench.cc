#include "tools/bench/serve_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/tiny/default_model.h"
#include "grpcpp/grpcpp.h"
#include "tools/bench/serve_client.h"
#include "tools/bench/serve_engine.h"
#include "tools/bench/serve_procstat.h"
#include "tools/bench/serve_report.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

namespace pb = ::specula::v1;

// Independent streams from one --seed: prompts, arrivals and warmup prompts must not correlate.
constexpr uint64_t kArrivalSeedSalt = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kWarmupSeedSalt = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kSuffixSeedSalt = 0x165667b19e3779f9ull;

int Fail(const absl::Status& s) {
  std::cerr << "specula-bench serve: " << s << "\n";
  return 1;
}

absl::Status Validate(const ServeBenchOptions& o) {
  if (o.num_prompts < 1) return absl::InvalidArgumentError("--num-prompts must be >= 1");
  if (o.input_len < 1) return absl::InvalidArgumentError("--input-len must be >= 1");
  if (o.output_len < 1) return absl::InvalidArgumentError("--output-len must be >= 1");
  if (o.concurrency < 0 || o.max_concurrency < 0 || o.warmup < 0 || o.session_suffix_len < 0) {
    return absl::InvalidArgumentError(
        "--concurrency, --max-concurrency, --warmup, --session-suffix-len must be >= 0");
  }
  if (!(o.request_rate > 0)) return absl::InvalidArgumentError("--request-rate must be > 0");
  if (o.compare_engine && o.session_suffix_len > 0) {
    // The baseline would prefill every prompt whole: not the same work.
    return absl::InvalidArgumentError("--compare-engine cannot replay --session-suffix-len runs");
  }
  return absl::OkStatus();
}

std::string DescribeModel(const pb::ModelInfo& m) {
  return absl::StrFormat("%s, %d layers, hidden %d, vocab %d, %s on %s", m.architecture(),
                         m.num_layers(), m.hidden_size(), m.vocab_size(), m.dtype(), m.device());
}

std::string DescribeArrival(const ServeBenchOptions& o) {
  if (o.concurrency > 0) return absl::StrFormat("closed loop, concurrency %d", o.concurrency);
  std::string s = std::isinf(o.request_rate) ? std::string("all at once (rate inf)")
                                             : absl::StrFormat("Poisson, %g req/s", o.request_rate);
  if (o.max_concurrency > 0) absl::StrAppend(&s, ", max concurrency ", o.max_concurrency);
  return s;
}

// The batch the server runs this load at: the client's cap within the server's own limit.
int32_t ServedBatch(const ServeBenchOptions& o, const pb::ModelInfo& info) {
  int32_t batch = o.concurrency > 0       ? o.concurrency
                  : o.max_concurrency > 0 ? o.max_concurrency
                                          : o.num_prompts;
  const int32_t limit = static_cast<int32_t>(info.limits().max_running_requests());
  if (limit > 0) batch = std::min(batch, limit);
  return batch;
}

absl::StatusOr<EngineBaseline> CompareEngine(const ServeBenchOptions& o, const pb::ModelInfo& info,
                                             int32_t batch,
                                             const std::vector<std::vector<int32_t>>& prompts) {
  std::string dir = o.model_dir;
  if (dir.empty()) {
    absl::StatusOr<std::string> d = EnsureDefaultModel();
    if (!d.ok()) return d.status();
    dir = *d;
  }
  // The server's settings where ModelInfo tells them, its defaults otherwise.
  GeneratorOptions go;
  go.max_running = batch;
  go.threads = o.threads;
  if (info.limits().kv_cache_tokens() > 0) {
    go.kv_cache_tokens = static_cast<int64_t>(info.limits().kv_cache_tokens());
  }
  if (info.limits().prefill_chunk_tokens() > 0) {
    go.prefill_chunk_tokens = static_cast<int32_t>(info.limits().prefill_chunk_tokens());
  }
  ExpectedModel expected;
  expected.vocab_size = info.vocab_size();
  expected.num_layers = info.num_layers();
  expected.hidden_size = info.hidden_size();
  return RunEngineBaseline(dir, go, expected, prompts, o.output_len);
}

}  // namespace

namespace {

// Requests before the measured run (o.warmup of them, at the served batch), reported apart.
void Warmup(pb::Specula::Stub* stub, const ServeBenchOptions& o, int32_t vocab, int32_t batch) {
  LoadPlan warm;
  warm.prompts = RandomPrompts(o.warmup, o.input_len, vocab, o.seed ^ kWarmupSeedSalt);
  warm.output_len = o.output_len;
  warm.max_concurrency = batch;
  warm.timeout_seconds = o.timeout_seconds;
  const LoadResult r = RunLoad(stub, warm);
  const BenchSummary ws = SummarizeRun(r.records, r.duration_seconds);
  std::cout << absl::StrFormat("warmup: %d/%d requests ok in %.2f s\n", ws.completed, o.warmup,
                               r.duration_seconds);
}

// With o.session_suffix_len: one session per prompt, named uniquely for this process.
std::vector<std::string> SessionIds(const ServeBenchOptions& o) {
  std::vector<std::string> ids;
  if (o.session_suffix_len == 0) return ids;
  for (int32_t i = 0; i < o.num_prompts; ++i)
    ids.push_back(absl::StrCat("bench-", getpid(), "-", i));
  return ids;
}

// The sessions' first turns (o.session_suffix_len > 0): each measured prompt without its new
// tokens, under its session, with max_tokens 1, `batch` at a time (as the measured run), so the
// measured second turns find their KV cached. Not measured; every one must succeed.
absl::Status FirstTurns(pb::Specula::Stub* stub, const ServeBenchOptions& o, const LoadPlan& plan,
                        int32_t batch) {
  LoadPlan first;
  for (const std::vector<int32_t>& prompt : plan.prompts) {
    first.prompts.emplace_back(prompt.begin(), prompt.end() - o.session_suffix_len);
  }
  first.output_len = 1;
  first.max_concurrency = batch;
  first.timeout_seconds = o.timeout_seconds;
  first.session_ids = plan.session_ids;
  const LoadResult r = RunLoad(stub, first);
  int64_t tokens = 0;
  for (const RequestRecord& record : r.records) {
    if (!record.ok) {
      return absl::Status(static_cast<absl::StatusCode>(record.status_code),
                          absl::StrCat("a session's first turn failed: ", record.error));
    }
    tokens += record.output_tokens();
  }
  std::cout << absl::StrFormat(
      "sessions: %d first turns (max_tokens 1: %d tokens) in %.2f s, not measured\n", o.num_prompts,
      tokens, r.duration_seconds);
  return absl::OkStatus();
}

// The measured run: a fixed concurrency, or arrivals at o.request_rate under o.max_concurrency.
// With sessions, each prompt is its first turn's and o.session_suffix_len new tokens.
LoadPlan MeasuredPlan(const ServeBenchOptions& o, int32_t vocab) {
  LoadPlan plan;
  plan.prompts = RandomPrompts(o.num_prompts, o.input_len, vocab, o.seed);
  if (o.session_suffix_len > 0) {
    const std::vector<std::vector<int32_t>> suffixes =
        RandomPrompts(o.num_prompts, o.session_suffix_len, vocab, o.seed ^ kSuffixSeedSalt);
    for (size_t i = 0; i < plan.prompts.size(); ++i) {
      plan.prompts[i].insert(plan.prompts[i].end(), suffixes[i].begin(), suffixes[i].end());
    }
  }
  plan.session_ids = SessionIds(o);
  plan.output_len = o.output_len;
  plan.timeout_seconds = o.timeout_seconds;
  if (o.concurrency > 0) {
    plan.max_concurrency = o.concurrency;
  } else {
    plan.max_concurrency = o.max_concurrency;
    if (!std::isinf(o.request_rate)) {
      plan.arrival_offsets =
          ArrivalOffsets(o.num_prompts, o.request_rate, o.seed ^ kArrivalSeedSalt);
    }
  }
  return plan;
}

ServeRunInfo DescribeRun(const ServeBenchOptions& o, const pb::ModelInfo& info, int32_t batch,
                         std::map<std::string, double> server_cpu) {
  ServeRunInfo run;
  run.server = o.server;
  run.model = DescribeModel(info);
  run.arrival = DescribeArrival(o);
  run.num_prompts = o.num_prompts;
  run.input_len = o.input_len;
  run.output_len = o.output_len;
  run.seed = o.seed;
  run.warmup = o.warmup;
  run.session_suffix_len = o.session_suffix_len;
  run.engine_max_running = batch;
  run.server_cpu_by_thread = std::move(server_cpu);
  return run;
}

}  // namespace

int RunServeBench(const ServeBenchOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return Fail(s);
  // One channel, one HTTP/2 connection multiplexing every stream, as a typical client does.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials());
  absl::StatusOr<pb::ModelInfo> info = FetchModelInfo(channel, 10);
  if (!info.ok()) return Fail(info.status());
  if (info->vocab_size() < 2) return Fail(absl::FailedPreconditionError("vocab_size < 2"));
  const int64_t longest = int64_t{o.input_len} + o.session_suffix_len + o.output_len;
  if (info->max_context_tokens() > 0 && longest > info->max_context_tokens()) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--input-len + --session-suffix-len + --output-len = %d exceeds the model's context of %d",
        longest, info->max_context_tokens())));
  }
  const int32_t vocab = static_cast<int32_t>(info->vocab_size());
  const int32_t batch = ServedBatch(o, *info);
  std::unique_ptr<pb::Specula::Stub> stub = pb::Specula::NewStub(channel);

  if (o.warmup > 0) Warmup(stub.get(), o, vocab, batch);
  const LoadPlan plan = MeasuredPlan(o, vocab);
  if (o.session_suffix_len > 0) {
    if (absl::Status s = FirstTurns(stub.get(), o, plan, batch); !s.ok()) return Fail(s);
  }
  std::map<std::string, double> server_cpu_before;
  if (o.server_pid > 0) {
    absl::StatusOr<std::map<std::string, double>> cpu = ThreadCpuByName(o.server_pid);
    if (!cpu.ok()) return Fail(cpu.status());
    server_cpu_before = *std::move(cpu);
  }
  const LoadResult load = RunLoad(stub.get(), plan);
  std::map<std::string, double> server_cpu;
  if (o.server_pid > 0) {
    absl::StatusOr<std::map<std::string, double>> cpu = ThreadCpuByName(o.server_pid);
    if (!cpu.ok()) return Fail(cpu.status());
    server_cpu = CpuDelta(server_cpu_before, *cpu, 0.005);
  }
  const BenchSummary summary = SummarizeRun(load.records, load.duration_seconds);

  std::optional<EngineBaseline> engine;
  if (o.compare_engine) {
    absl::StatusOr<EngineBaseline> b = CompareEngine(o, *info, batch, plan.prompts);
    if (!b.ok()) return Fail(b.status());
    engine = *b;
  }

  const ServeRunInfo run = DescribeRun(o, *info, batch, std::move(server_cpu));
  PrintReport(run, load, summary, engine, std::cout);
  if (!o.json_path.empty()) {
    if (absl::Status s = WriteJson(o.json_path, run, load, summary, engine); !s.ok()) {
      return Fail(s);
    }
  }
  return summary.completed > 0 ? 0 : 1;
}

}  // namespace specula
