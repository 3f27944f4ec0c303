#include "tools/bench/constrained_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
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

// Output tokens per second over `steps` steps with the batch full and every prompt prefilled
// (refilled as requests end; a new request's prefill counts in the step that runs it).
absl::StatusOr<double> TimedRun(Generator& g, const ConstrainedBenchOptions& o,
                                const Grammars* grammars, int64_t* next) {
  std::vector<SequenceOutput> out;
  int in_flight = 0;
  auto refill = [&]() -> absl::Status {
    for (; in_flight < o.batch; ++in_flight) {
      absl::StatusOr<uint64_t> id = g.Add(MakeRequest((*next)++, o.temperature, grammars));
      if (!id.ok()) return id.status();
    }
    return absl::OkStatus();
  };
  auto step = [&](int64_t* tokens) -> absl::Status {
    out.clear();
    if (absl::Status s = g.Step(&out); !s.ok()) return s;
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
  int64_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.steps; ++i) {
    if (absl::Status s = step(&tokens); !s.ok()) return s;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  while (g.HasWork()) {  // drain: the next run starts empty
    out.clear();
    if (absl::Status s = g.Step(&out); !s.ok()) return s;
  }
  return tokens / seconds;
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
  std::printf("| run | free tok/s | constrained tok/s | ratio |\n|---|---|---|---|\n");
  for (int pair = -1; pair < o.pairs; ++pair) {
    absl::StatusOr<double> free = TimedRun(**g, o, nullptr, &next);
    absl::StatusOr<double> held = TimedRun(**g, o, &*grammars, &next);
    if (!free.ok() || !held.ok()) {
      std::cerr << "specula-bench constrained: " << (free.ok() ? held.status() : free.status())
                << "\n";
      return 1;
    }
    if (pair >= 0) ratios.push_back(*held / *free);
    std::printf("| %s | %.0f | %.0f | %.3f |\n",
                pair < 0 ? "warm-up" : std::to_string(pair + 1).c_str(), *free, *held,
                *held / *free);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "\nbatch %d, temperature %g, %d steps a run, %zu schemas: median constrained/free "
      "%.3f\n",
      o.batch, o.temperature, o.steps, grammars->size(), Percentile(ratios, 50));
  return 0;
}

}  // namespace specula
