#include "tools/bench/serve_engine.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "tools/bench/serve_procstat.h"

namespace specula {
namespace {

using Clock = BenchClock;

absl::Status CheckModel(const ModelConfig& c, const ExpectedModel& e) {
  if (c.vocab_size == e.vocab_size && c.num_hidden_layers == e.num_layers &&
      c.hidden_size == e.hidden_size) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "--model is not the server's model: vocab/layers/hidden %d/%d/%d here, %d/%d/%d served",
      c.vocab_size, c.num_hidden_layers, c.hidden_size, e.vocab_size, e.num_layers, e.hidden_size));
}

}  // namespace

absl::StatusOr<EngineBaseline> RunEngineBaseline(const std::string& model_dir,
                                                 const GeneratorOptions& options,
                                                 const ExpectedModel& expected,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int32_t output_len) {
  EngineBaseline b;
  const Clock::time_point load_start = Clock::now();
  absl::StatusOr<std::unique_ptr<Generator>> created = Generator::Create(model_dir, options);
  if (!created.ok()) return created.status();
  Generator& g = **created;
  b.load_seconds = Seconds(load_start, Clock::now());
  if (absl::Status s = CheckModel(g.model_config(), expected); !s.ok()) return s;

  std::vector<GenerationRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt = prompts[i];
    requests[i].sampling.temperature = 0;
    requests[i].stopping.max_tokens = output_len;
    requests[i].stopping.ignore_eos = true;
    b.input_tokens += static_cast<int64_t>(prompts[i].size());
  }

  std::vector<SequenceOutput> outputs;
  int64_t decode_rows = 0;
  size_t next = 0;
  const double cpu0 = ProcessCpuSeconds();
  const Clock::time_point t0 = Clock::now();
  while (next < requests.size() || g.HasWork()) {
    // Admit in order until the batch or the KV pool is full, as the server's scheduler does.
    while (next < requests.size()) {
      absl::StatusOr<uint64_t> id = g.Add(requests[next]);
      if (absl::IsResourceExhausted(id.status()) && g.HasWork()) break;
      if (!id.ok()) return id.status();
      ++next;
    }
    outputs.clear();
    if (absl::Status s = g.Step(&outputs); !s.ok()) return s;
    ++b.steps;
    decode_rows += g.last_step().decode_rows;
    for (const SequenceOutput& out : outputs) b.output_tokens += out.tokens.size();
  }
  b.duration_seconds = Seconds(t0, Clock::now());
  b.cpu_seconds = ProcessCpuSeconds() - cpu0;
  if (b.steps > 0) b.mean_decode_rows = static_cast<double>(decode_rows) / b.steps;
  if (b.duration_seconds > 0) b.output_throughput = b.output_tokens / b.duration_seconds;
  return b;
}

}  // namespace specula
