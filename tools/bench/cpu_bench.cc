#include "tools/bench/cpu_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/generate/generator.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best of several large memcpy passes: the bandwidth a weight-streaming decode step can hope for.
double MeasureCopyBandwidth() {
  const size_t bytes = size_t{512} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double s = Seconds(t0, Clock::now());
    // A copy reads and writes every byte.
    best = std::max(best, 2.0 * bytes / s);
  }
  return best;
}

struct Row {
  std::string model;
  double params_m = 0;
  double weight_mb = 0;
  double prefill_tps = 0;
  std::vector<double> decode_tps;
  double bound_tps = 0;
};

absl::StatusOr<Row> BenchModel(const std::string& dir, const std::string& preset,
                               const CpuBenchOptions& o, double bandwidth) {
  GeneratorOptions go;
  go.threads = o.threads;
  go.kv_cache_tokens = int64_t{1} << 16;
  go.prefill_chunk_tokens = o.prompt_tokens;
  go.max_running = std::max(64, *std::max_element(o.decode_batches.begin(), o.decode_batches.end()));
  auto gen = Generator::Create(dir, go);
  if (!gen.ok()) return gen.status();
  Generator& g = **gen;
  Row row;
  row.model = preset;
  // The CPU backend stores fp32 weights: 4 bytes a parameter.
  const ModelWeights& w = g.model().weights();
  const size_t weight_bytes = w.decode_bytes_per_token();
  row.params_m = w.bytes() / sizeof(float) / 1e6;
  row.weight_mb = weight_bytes / 1e6;
  row.bound_tps = bandwidth / weight_bytes;

  auto make_request = [&](int prompt_len, int max_tokens) {
    GenerationRequest r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(1 + (i * 7919) % 200);
    r.sampling.temperature = 0;
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    return r;
  };

  // Prefill: one long prompt, one token out.
  {
    std::vector<SequenceOutput> out;
    auto id = g.Add(make_request(o.prompt_tokens, 1));
    if (!id.ok()) return id.status();
    const auto t0 = Clock::now();
    while (g.HasWork()) {
      if (auto s = g.Step(&out); !s.ok()) return s;
    }
    row.prefill_tps = o.prompt_tokens / Seconds(t0, Clock::now());
  }
  // Decode at each batch size: timed from the first decode step after every prompt is in.
  for (int batch : o.decode_batches) {
    std::vector<SequenceOutput> out;
    for (int b = 0; b < batch; ++b) {
      if (auto id = g.Add(make_request(16, o.decode_tokens + 1)); !id.ok()) return id.status();
    }
    // Prefill every prompt (and sample its first token) before the clock starts.
    std::set<uint64_t> started;
    while (static_cast<int>(started.size()) < batch) {
      out.clear();
      if (auto s = g.Step(&out); !s.ok()) return s;
      for (const auto& x : out) started.insert(x.id);
    }
    int64_t tokens = 0;
    const auto t0 = Clock::now();
    while (g.HasWork()) {
      out.clear();
      if (auto s = g.Step(&out); !s.ok()) return s;
      for (const auto& x : out) tokens += static_cast<int64_t>(x.tokens.size());
    }
    row.decode_tps.push_back(tokens / Seconds(t0, Clock::now()));
  }
  return row;
}

}  // namespace

int RunCpuBench(const CpuBenchOptions& o) {
  namespace fs = std::filesystem;
  const fs::path work = o.work_dir.empty()
                            ? fs::temp_directory_path() / absl::StrCat("specula-bench-", getpid())
                            : fs::path(o.work_dir);
  const double bandwidth = MeasureCopyBandwidth();
  std::cout << absl::StrFormat("memcpy bandwidth (read+write): %.1f GB/s, threads: %d\n\n",
                               bandwidth / 1e9, o.threads);
  std::cout << "| model | params (M) | fp32 weight MB/token | prefill tok/s |";
  for (int b : o.decode_batches) std::cout << absl::StrFormat(" decode b=%d tok/s |", b);
  std::cout << " b=1 bound tok/s | b=1 / bound |\n|---|---|---|---|";
  for (size_t i = 0; i < o.decode_batches.size(); ++i) std::cout << "---|";
  std::cout << "---|---|\n";
  int rc = 0;
  for (const std::string& preset : o.presets) {
    TinyModelOptions t;
    t.out_dir = (work / preset).string();
    t.arch = TinyArch::kLlama3;
    t.preset = preset;
    if (absl::Status s = WriteTinyModel(t); !s.ok()) {
      std::cerr << "specula-bench: " << s << "\n";
      rc = 1;
      continue;
    }
    auto row = BenchModel(t.out_dir, preset, o, bandwidth);
    if (!row.ok()) {
      std::cerr << "specula-bench: " << preset << ": " << row.status() << "\n";
      rc = 1;
      continue;
    }
    std::cout << absl::StrFormat("| %s | %.1f | %.1f | %.0f |", row->model, row->params_m,
                                 row->weight_mb, row->prefill_tps);
    for (double d : row->decode_tps) std::cout << absl::StrFormat(" %.1f |", d);
    const double b1 = row->decode_tps.empty() ? 0 : row->decode_tps[0];
    std::cout << absl::StrFormat(" %.1f | %.2f |\n", row->bound_tps, b1 / row->bound_tps);
  }
  if (o.work_dir.empty()) fs::remove_all(work);
  return rc;
}

}  // namespace specula
