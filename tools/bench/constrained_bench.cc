#include "tools/bench/constrained_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/generate/generator.h"
#include "engine/grammar/json_schema.h"
#include "nlohmann/json.hpp"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

using Grammars = std::vector<std::shared_ptr<const grammar::Grammar>>;

absl::StatusOr<Grammars> CompileSchemas(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const auto schemas = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (!schemas.is_array()) return absl::InvalidArgumentError(file + " is not a JSON array");
  Grammars grammars;
  for (const auto& entry : schemas) {
    grammar::JsonSchemaOptions o;
    o.strict = entry.value("strict", false);
    absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g =
        grammar::CompileJsonSchema(entry["schema"], o);
    if (!g.ok()) return g.status();
    grammars.push_back(*std::move(g));
  }
  return grammars;
}

// The `n`-th request of a run: a short prompt, constrained by a schema or free.
GenerationRequest MakeRequest(int64_t n, float temperature, const Grammars* grammars) {
  GenerationRequest r;
  for (int i = 0; i < 16; ++i) r.prompt.push_back(static_cast<int32_t>(1 + (n * 31 + i * 7) % 500));
  r.sampling.temperature = temperature;
  r.sampling.seed = static_cast<uint64_t>(n);
  r.stopping.max_tokens = 256;
  if (grammars != nullptr) {
    r.constraint.grammar = (*grammars)[static_cast<size_t>(n) % grammars->size()];
  }
  return r;
}

struct RunFigures {
  double tokens_per_second = 0;
  double slowest_step_ms = 0;  // what every running request waited for once
};

// Output tokens per second over `steps` steps with the batch full and every prompt prefilled
// (refilled as requests end; a new request's prefill counts in the step that runs it), and the
// slowest of those steps. As the engine does, a request whose grammar is new waits for its mask
// cache's preparation (Generator::PrepareMasks) while the others run.
absl::StatusOr<RunFigures> TimedRun(Generator& g, const ConstrainedBenchOptions& o,
                                    const Grammars* grammars, int64_t* next) {
  std::vector<SequenceOutput> out;
  std::deque<GenerationRequest> waiting;  // for their grammars' preparation
  int in_flight = 0;
  auto refill = [&]() -> absl::Status {
    while (static_cast<int>(waiting.size()) + in_flight < o.batch) {
      waiting.push_back(MakeRequest((*next)++, o.temperature, grammars));
      if (o.prepare) g.PrepareMasks(waiting.back());
    }
    for (auto it = waiting.begin(); it != waiting.end() && in_flight < o.batch;) {
      if (!g.MasksReady(*it)) {
        ++it;
        continue;
      }
      absl::StatusOr<uint64_t> id = g.Add(std::move(*it));
      if (!id.ok()) return id.status();
      it = waiting.erase(it);
      ++in_flight;
    }
    return absl::OkStatus();
  };
  RunFigures figures;
  auto step = [&](int64_t* tokens) -> absl::Status {
    while (!g.HasWork()) {  // every request waits for a preparation (the time counts)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (absl::Status s = refill(); !s.ok()) return s;
    }
    out.clear();
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = g.Step(&out); !s.ok()) return s;
    figures.slowest_step_ms =
        std::max(figures.slowest_step_ms,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    for (const SequenceOutput& x : out) {
      if (!x.error.ok()) return x.error;
      *tokens += static_cast<int64_t>(x.tokens.size());
      if (x.finish != FinishReason::kNone) --in_flight;
    }
    return refill();
  };
  if (absl::Status s = refill(); !s.ok()) return s;
  int64_t ignored = 0;
  for (int i = 0; i < 8; ++i) {  // the first batch's prefills
    if (absl::Status s = step(&ignored); !s.ok()) return s;
  }
  figures.slowest_step_ms = 0;
  int64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    if (absl::Status s = step(&tokens); !s.ok()) return s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  while (g.HasWork()) {  // drain: the next run starts empty (what waits is not run)
    out.clear();
    if (absl::Status s = g.Step(&out); !s.ok()) return s;
  }
  figures.tokens_per_second = tokens / seconds;
  return figures;
}

}  // namespace

int RunConstrainedBench(const ConstrainedBenchOptions& o) {
  absl::StatusOr<Grammars> grammars = CompileSchemas(o.schemas_file);
  if (!grammars.ok() || grammars->empty()) {
    std::cerr << "specula-bench constrained: " << grammars.status() << "\n";
    return 1;
  }
  GeneratorOptions go;
  go.threads = o.threads;
  go.device = o.device;
  go.max_running = o.batch;
  go.kv_cache_tokens = int64_t{o.batch} * 512;
  absl::StatusOr<std::unique_ptr<Generator>> g = Generator::Create(o.model_dir, go);
  if (!g.ok()) {
    std::cerr << "specula-bench constrained: " << g.status() << "\n";
    return 1;
  }
  int64_t next = 0;
  // A warm-up run each way: the constrained one builds the schemas' mask caches, as the first
  // requests with a schema do on a server.
  std::vector<double> ratios;
  std::printf(
      "| run | free tok/s | constrained tok/s | ratio | slowest step free / constrained (ms) "
      "|\n|---|---|---|---|---|\n");
  for (int pair = -1; pair < o.pairs; ++pair) {
    absl::StatusOr<RunFigures> free = TimedRun(**g, o, nullptr, &next);
    absl::StatusOr<RunFigures> held = TimedRun(**g, o, &*grammars, &next);
    if (!free.ok() || !held.ok()) {
      std::cerr << "specula-bench constrained: " << (free.ok() ? held.status() : free.status())
                << "\n";
      return 1;
    }
    const double ratio = held->tokens_per_second / free->tokens_per_second;
    if (pair >= 0) ratios.push_back(ratio);
    std::printf("| %s | %.0f | %.0f | %.3f | %.1f / %.1f |\n",
                pair < 0 ? "warm-up" : std::to_string(pair + 1).c_str(), free->tokens_per_second,
                held->tokens_per_second, ratio, free->slowest_step_ms, held->slowest_step_ms);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "\nbatch %d, temperature %g, %d steps a run, %zu schemas: median constrained/free "
      "%.3f\n",
      o.batch, o.temperature, o.steps, grammars->size(), Percentile(ratios, 50));
  return 0;
}

}  // namespace specula
