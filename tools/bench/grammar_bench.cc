#include "tools/bench/grammar_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "engine/generate/output_constraint.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/grammar/token_mask.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

struct WalkTimings {
  std::vector<double> mask_us;
  int walks = 0, ended = 0;
};

struct Timings {
  std::vector<double> compile_us, prepare_us;
  WalkTimings first, later;  // a schema's first walk builds its cache; later ones reuse it
};

// One random walk: masks, then a uniformly random allowed token, until the answer is complete
// (or may end, with probability 1/4 each such step) or max_steps.
void Walk(const std::shared_ptr<const grammar::Grammar>& g, const Tokenizer& tokenizer,
          grammar::TokenMasker& masker, grammar::MaskCache* cache, int max_steps, std::mt19937& rng,
          WalkTimings* t) {
  grammar::GrammarMatcher matcher(g);
  std::vector<uint32_t> mask;
  ++t->walks;
  for (int step = 0; step < max_steps; ++step) {
    if (matcher.IsComplete() || (matcher.CanEnd() && rng() % 4 == 0)) {
      ++t->ended;
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t allowed = masker.Compute(matcher, cache, &mask);
    t->mask_us.push_back(MicrosSince(start));
    if (allowed == 0) return;
    int64_t pick = static_cast<int64_t>(rng() % static_cast<uint64_t>(allowed));
    for (int64_t id = 0;; ++id) {
      if (grammar::MaskAllows(mask, id) && pick-- == 0) {
        matcher.Advance(tokenizer.TokenBytes(static_cast<TokenId>(id)));
        break;
      }
    }
  }
}

}  // namespace

int RunGrammarBench(const GrammarBenchOptions& options) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromDirectory(options.tokenizer_dir);
  if (!tokenizer.ok()) {
    std::cerr << "specula-bench grammar: " << tokenizer.status() << "\n";
    return 1;
  }
  std::ifstream in(options.schemas_file);
  std::stringstream text;
  text << in.rdbuf();
  const auto schemas = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (!schemas.is_array()) {
    std::cerr << "specula-bench grammar: " << options.schemas_file << " is not a JSON array\n";
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  const grammar::TokenTable table = GrammarTokenTable(**tokenizer);
  const double table_ms = MicrosSince(start) / 1000;
  grammar::SharedMaskEntries shared;
  grammar::TokenMasker masker(
      table, {.threads = options.mask_threads, .shared = options.share_walks ? &shared : nullptr});
  std::mt19937 rng(42);
  Timings t;
  for (const auto& entry : schemas) {
    grammar::JsonSchemaOptions o;
    o.strict = entry.value("strict", false);
    start = std::chrono::steady_clock::now();
    auto g = grammar::CompileJsonSchema(entry["schema"], o);
    t.compile_us.push_back(MicrosSince(start));
    if (!g.ok()) {
      std::cerr << "specula-bench grammar: " << g.status() << "\n";
      return 1;
    }
    grammar::MaskCache cache;  // one per schema, shared by its walks as by a request's steps
    if (options.prepare) {
      start = std::chrono::steady_clock::now();
      masker.Prepare(**g, &cache, std::chrono::steady_clock::time_point::max());
      t.prepare_us.push_back(MicrosSince(start));
    }
    for (int w = 0; w < options.walks_per_schema; ++w) {
      Walk(*g, **tokenizer, masker, &cache, options.max_steps, rng, w == 0 ? &t.first : &t.later);
    }
  }
  std::sort(t.compile_us.begin(), t.compile_us.end());
  std::printf("vocabulary %lld tokens (table built in %.1f ms), %zu schemas, %d walks each\n",
              static_cast<long long>(table.vocab_size()), table_ms, schemas.size(),
              options.walks_per_schema);
  std::printf("walks shared between schemas: %s (%zu kept, %lld found)\n\n",
              options.share_walks ? "yes" : "no", shared.size(),
              static_cast<long long>(shared.hits()));
  // A step over 10 ms holds a whole batch's step back: how many there were, not just the p99.
  std::printf(
      "| | median | p99 | max | count | over 10 ms | walks ended |\n"
      "|---|---|---|---|---|---|---|\n");
  std::printf("| compile (us) | %.0f | %.0f | %.0f | %zu | | |\n", Percentile(t.compile_us, 50),
              Percentile(t.compile_us, 99), t.compile_us.back(), t.compile_us.size());
  if (!t.prepare_us.empty()) {
    std::sort(t.prepare_us.begin(), t.prepare_us.end());
    std::printf("| prepare (us) | %.0f | %.0f | %.0f | %zu | | |\n", Percentile(t.prepare_us, 50),
                Percentile(t.prepare_us, 99), t.prepare_us.back(), t.prepare_us.size());
  }
  for (auto [name, w] : {std::pair{"mask, first walk (us)", &t.first},
                         std::pair{"mask, later walks (us)", &t.later}}) {
    std::sort(w->mask_us.begin(), w->mask_us.end());
    if (w->mask_us.empty()) continue;
    const auto stalls =
        w->mask_us.end() - std::upper_bound(w->mask_us.begin(), w->mask_us.end(), 1e4);
    std::printf("| %s | %.0f | %.0f | %.0f | %zu | %td | %d of %d |\n", name,
                Percentile(w->mask_us, 50), Percentile(w->mask_us, 99), w->mask_us.back(),
                w->mask_us.size(), stalls, w->ended, w->walks);
  }
  return 0;
}

}  // namespace specula
