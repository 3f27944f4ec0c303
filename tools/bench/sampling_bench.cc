#include "tools/bench/sampling_bench.h"

#include <utility>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/backend_factory.h"
#include "engine/sampling/row_sampling.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

struct Setting {
  const char* name;
  RowSampling row;
};

const Setting kSettings[] = {
    {"greedy", {0.0f, 0, 1.0f, 0.0f, -1}},
    {"temperature 0.7", {0.7f, 0, 1.0f, 0.0f, -1}},
    {"top_p 0.9", {0.7f, 0, 0.9f, 0.0f, -1}},
    {"top_k 40, logprobs 5", {0.7f, 40, 1.0f, 0.0f, 5}},
    {"top_p 0.95, min_p 0.05, logprobs 20", {1.0f, 0, 0.95f, 0.05f, 20}},
};

// Median milliseconds of `fn` over `repeats` runs after one warm-up.
template <typename Fn>
double MedianMs(int repeats, Fn&& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(std::move(ms));
}

// One row count's logits, settings and results in backend memory.
struct Problem {
  int rows = 0;
  DeviceBuffer logits, settings, out;
};

Problem MakeProblem(Backend& b, int rows, int64_t vocab) {
  Problem p;
  p.rows = rows;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  std::mt19937_64 rng(rows);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& x : logits) x = normal(rng);
  p.logits = b.Allocate(logits.size() * sizeof(float)).value();
  b.CopyToDevice(p.logits.data(), logits.data(), logits.size() * sizeof(float));
  p.settings = b.Allocate(rows * sizeof(RowSampling)).value();
  p.out = b.Allocate(rows * sizeof(SampledRow)).value();
  return p;
}

}  // namespace

int RunSamplingBench(const SamplingBenchOptions& o) {
  BackendOptions options;
  options.device = o.device;
  auto backend = CreateBackend(options);
  if (!backend.ok()) {
    std::cerr << "specula-bench sampling: " << backend.status() << "\n";
    return 1;
  }
  Backend& b = **backend;
  std::printf(
      "Sampling %lld-token rows on %s (median of %d): device = SampleRows and its "
      "results read back; host = the logits read back, then sampled row by row\n\n",
      static_cast<long long>(o.vocab), b.name().c_str(), o.repeats);
  std::printf("| setting | rows | device ms | host ms | host / device | device us per row |\n");
  std::printf("|---|---|---|---|---|---|\n");
  RowSampler host_sampler;
  for (int rows : o.rows) {
    Problem p = MakeProblem(b, rows, o.vocab);
    std::vector<float> host_logits(static_cast<size_t>(rows * o.vocab));
    std::vector<SampledRow> results(rows);
    for (const Setting& s : kSettings) {
      std::vector<RowSampling> settings(rows, s.row);
      for (int r = 0; r < rows; ++r) settings[r].uniform = (r + 0.5) / rows;
      b.CopyToDevice(p.settings.data(), settings.data(), rows * sizeof(RowSampling));
      const Mat logits(p.logits.as<float>(), rows, o.vocab);
      const double device = MedianMs(o.repeats, [&] {
        b.SampleRows(logits, DeviceSpan<const RowSampling>(p.settings.as<RowSampling>(), rows),
                     DeviceSpan<SampledRow>(p.out.as<SampledRow>(), rows));
        b.CopyToHost(results.data(), p.out.data(), rows * sizeof(SampledRow));
      });
      const double host = MedianMs(o.repeats, [&] {
        b.CopyToHost(host_logits.data(), p.logits.data(), host_logits.size() * sizeof(float));
        for (int r = 0; r < rows; ++r) {
          results[r] = host_sampler.Sample(settings[r],
                                           absl::MakeConstSpan(&host_logits[r * o.vocab], o.vocab));
        }
      });
      std::printf("| %s | %d | %.3f | %.3f | %.1f | %.1f |\n", s.name, rows, device, host,
                  host / device, 1e3 * device / rows);
    }
  }
  return 0;
}

}  // namespace specula
