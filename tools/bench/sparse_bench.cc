#include "tools/bench/sparse_bench.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/generate/generator.h"
#include "tools/bench/retrieval_eval.h"
#include "tools/bench/serve_stats.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int32_t kPageSize = 16;
constexpr int32_t kSinkTokens = 16;
constexpr int32_t kRecentTokens = 16;

using Example = RetrievalExample;

// Resident bytes of [address, address + bytes) (mincore): what the host store really occupies,
// whatever else the process maps next to it.
int64_t ResidentBytes(const void* address, size_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(address) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(address) + bytes;
  std::vector<unsigned char> in_core((end - begin + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) != 0) return -1;
  int64_t resident = 0;
  for (unsigned char c : in_core) resident += (c & 1) != 0;
  return resident * static_cast<int64_t>(page);
}

GeneratorOptions BaseOptions(int threads, int64_t kv_tokens, int32_t max_running,
                             const std::string& kv_dtype) {
  GeneratorOptions o;
  o.kv_dtype = kv_dtype;
  o.page_size = kPageSize;
  o.kv_cache_tokens = kv_tokens;
  o.prefill_chunk_tokens = 2048;
  o.max_running = max_running;
  o.threads = threads;
  return o;
}

SparseOptions Sparse(int64_t budget, SpeculationMode mode, const SparseBenchOptions& o) {
  SparseOptions s;
  if (o.prefetch_extra >= 0) {
    s.prefetch_extra_tokens = static_cast<int64_t>(std::lround(o.prefetch_extra * budget));
  }
  s.enabled = true;
  s.budget_tokens = budget;
  s.sink_tokens = kSinkTokens;
  s.recent_tokens = kRecentTokens;
  s.speculation = mode;
  s.miss_policy = o.miss_policy;
  s.miss_correction = o.miss_correction;
  s.min_context_tokens = 0;
  return s;
}

// The miss policy as the tables' headings give it.
std::string PolicyName(const SparseBenchOptions& o) {
  // The bench runs the CPU backend, whose memory is the host's.
  const MissPolicy runs = ResolveMissPolicy(o.miss_policy, /*backend_memory_is_host_memory=*/true);
  const std::string name = runs == MissPolicy::kFetch
                               ? "fetch"
                               : absl::StrFormat("defer, miss_correction %g", o.miss_correction);
  return o.miss_policy == MissPolicy::kAuto ? "auto: " + name : name;
}

struct QualityRow {
  double accuracy = 0;        // exact match of the whole answer
  double token_accuracy = 0;  // answer tokens right, position by position
  double recall = -1;         // attention mass attended; -1 for dense
  KvStats kv;                 // summed over examples
  int64_t decode_tokens = 0;
  double seconds = 0;
};

// Runs every example batched, greedy, max_tokens = answer length.
absl::StatusOr<QualityRow> RunExamples(const std::string& model, const GeneratorOptions& options,
                                       const std::vector<Example>& examples) {
  ASSIGN_OR_RETURN(std::unique_ptr<Generator> gen, Generator::Create(model, options));
  RecallProbe probe;
  if (gen->sparse_cache() != nullptr) gen->sparse_cache()->set_recall_probe(&probe);
  std::map<uint64_t, size_t> index;
  std::vector<std::vector<int32_t>> got(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    GenerationRequest r;
    r.prompt = examples[i].prompt;
    r.sampling.temperature = 0;
    r.stopping.max_tokens = static_cast<int32_t>(examples[i].answer.size());
    r.stopping.ignore_eos = true;
    ASSIGN_OR_RETURN(uint64_t id, gen->Add(std::move(r)));
    index[id] = i;
  }
  QualityRow row;
  const auto t0 = Clock::now();
  std::vector<SequenceOutput> outs;
  while (gen->HasWork()) {
    outs.clear();
    RETURN_IF_ERROR(gen->Step(&outs));
    for (const SequenceOutput& o : outs) {
      auto& g = got[index.at(o.id)];
      g.insert(g.end(), o.tokens.begin(), o.tokens.end());
      if (o.kv_stats) {
        row.kv.pages_hit += o.kv_stats->pages_hit;
        row.kv.pages_missed += o.kv_stats->pages_missed;
        row.kv.pages_late += o.kv_stats->pages_late;
        row.kv.bytes_fetched += o.kv_stats->bytes_fetched;
        row.kv.bytes_prefetched += o.kv_stats->bytes_prefetched;
        row.kv.stall_seconds += o.kv_stats->stall_seconds;
      }
    }
  }
  row.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  int64_t right = 0, tokens = 0, exact = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& want = examples[i].answer;
    bool all = got[i].size() == want.size();
    for (size_t t = 0; t < want.size(); ++t) {
      const bool ok = t < got[i].size() && got[i][t] == want[t];
      right += ok;
      all = all && ok;
    }
    tokens += static_cast<int64_t>(want.size());
    exact += all;
    row.decode_tokens += static_cast<int64_t>(want.size()) - 1;  // the first comes from prefill
  }
  row.accuracy = 100.0 * exact / examples.size();
  row.token_accuracy = 100.0 * right / tokens;
  if (probe.samples > 0) row.recall = probe.mass_sum / probe.samples;
  return row;
}

std::string BudgetName(double fraction) {
  return fraction >= 1.0 ? "full" : absl::StrFormat("%.1f%%", 100 * fraction);
}

int64_t BudgetTokens(double fraction, int64_t context) {
  if (fraction >= 1.0) return context + 64;
  return std::max<int64_t>(kPageSize, static_cast<int64_t>(std::lround(fraction * context)));
}

int RunQuality(const SparseBenchOptions& o) {
  std::map<int, fs::path> evals;
  const std::regex name("eval_([0-9]+)\\.json");
  for (const auto& e : fs::directory_iterator(o.retrieval_dir)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name)) evals[std::stoi(m[1])] = e.path();
  }
  if (!o.contexts.empty()) {
    std::map<int, fs::path> chosen;
    for (int c : o.contexts) {
      if (!evals.contains(c)) {
        std::cerr << "specula-bench sparse: no eval_" << c << ".json in " << o.retrieval_dir
                  << "\n";
        return 2;
      }
      chosen[c] = evals[c];
    }
    evals = chosen;
  }
  if (evals.empty()) {
    std::cerr << "specula-bench sparse: no eval_<ctx>.json files in " << o.retrieval_dir << "\n";
    return 2;
  }
  std::cout << absl::StrFormat(
      "### Quality (retrieval model, selector quest, sink %d + recent %d tokens, page %d, "
      "miss_policy %s, speculation cross_step)\n\n",
      kSinkTokens, kRecentTokens, kPageSize, PolicyName(o));
  std::map<int, std::vector<Example>> sets;
  for (const auto& [ctx, path] : evals) {
    auto examples = LoadRetrievalEval(path.string());
    if (!examples.ok()) {
      std::cerr << "specula-bench sparse: " << examples.status() << "\n";
      return 1;
    }
    sets[ctx] = std::move(*examples);
  }
  std::cout << "| context | budget | accuracy % | token acc. % | attention recall | hit rate | "
               "KB fetched+prefetched / token | stall ms / token |\n"
               "|---|---|---|---|---|---|---|---|\n";
  int rc = 0;
  for (const auto& [ctx, examples] : sets) {
    const int64_t tokens = static_cast<int64_t>(examples.size()) * (ctx + 64);
    const int32_t n = static_cast<int32_t>(examples.size());
    auto dense = RunExamples(o.retrieval_dir,
                             BaseOptions(o.threads, tokens, n, o.kv_dtypes.front()), examples);
    if (!dense.ok()) {
      std::cerr << "specula-bench sparse: dense " << ctx << ": " << dense.status() << "\n";
      return 1;
    }
    std::cout << absl::StrFormat("| %d | dense | %.1f | %.1f | 1 | - | - | - |\n", ctx,
                                 dense->accuracy, dense->token_accuracy);
    for (double f : o.budgets) {
      GeneratorOptions g = BaseOptions(o.threads, tokens, n, o.kv_dtypes.front());
      g.sparse = Sparse(BudgetTokens(f, ctx), SpeculationMode::kCrossStep, o);
      g.host_capacity_tokens = tokens;
      auto r = RunExamples(o.retrieval_dir, g, examples);
      if (!r.ok()) {
        std::cerr << "specula-bench sparse: " << ctx << " " << BudgetName(f) << ": " << r.status()
                  << "\n";
        rc = 1;
        continue;
      }
      const double per_token = std::max<int64_t>(1, r->decode_tokens);
      std::cout << absl::StrFormat(
          "| %d | %s (%d tok) | %.1f | %.1f | %.3f | %.3f | %.1f | %.3f |\n", ctx, BudgetName(f),
          g.sparse.budget_tokens, r->accuracy, r->token_accuracy, r->recall, r->kv.hit_rate(),
          (r->kv.bytes_fetched + r->kv.bytes_prefetched) / per_token / 1024.0,
          1e3 * r->kv.stall_seconds / per_token);
    }
  }

  // Speculation modes at the longest context, for the smaller budgets.
  const auto& [ctx, examples] = *sets.rbegin();
  const int64_t tokens = static_cast<int64_t>(examples.size()) * (ctx + 64);
  const int32_t n = static_cast<int32_t>(examples.size());
  std::cout << absl::StrFormat(
      "\n### Prefetch per speculation mode (context %d, %d requests batched, miss_policy %s)\n\n"
      "| budget | speculation | hit rate | late share | KB prefetched / token | "
      "KB fetched on miss / token | stall ms / token | decode tok/s |\n"
      "|---|---|---|---|---|---|---|---|\n",
      ctx, n, PolicyName(o));
  for (double f : o.budgets) {
    if (f >= 1.0) continue;
    for (SpeculationMode m : {SpeculationMode::kNone, SpeculationMode::kCrossStep,
                              SpeculationMode::kCrossLayer, SpeculationMode::kBoth}) {
      GeneratorOptions g = BaseOptions(o.threads, tokens, n, o.kv_dtypes.front());
      g.sparse = Sparse(BudgetTokens(f, ctx), m, o);
      g.host_capacity_tokens = tokens;
      auto r = RunExamples(o.retrieval_dir, g, examples);
      if (!r.ok()) {
        rc = 1;
        continue;
      }
      const double per_token = std::max<int64_t>(1, r->decode_tokens);
      // Late: right predictions whose copy had not landed when attention needed the page.
      const double late_share =
          r->kv.pages_selected() == 0
              ? 0.0
              : static_cast<double>(r->kv.pages_late) / static_cast<double>(r->kv.pages_selected());
      std::cout << absl::StrFormat(
          "| %s | %s | %.3f | %.3f | %.1f | %.1f | %.3f | %.0f |\n", BudgetName(f),
          SpeculationModeName(m), r->kv.hit_rate(), late_share,
          r->kv.bytes_prefetched / per_token / 1024.0, r->kv.bytes_fetched / per_token / 1024.0,
          1e3 * r->kv.stall_seconds / per_token, r->decode_tokens / r->seconds);
    }
  }
  std::cout << "\n";
  return rc;
}

struct CostRow {
  int64_t device_kv_bytes = 0;
  int64_t index_bytes = 0;
  int64_t host_rss_bytes = 0;
  int64_t host_capacity_bytes = 0;
  int64_t host_bytes_per_token = 0;  // over every layer and KV head
  double index_fraction_of_k = 0;    // selection index bytes / K bytes, per page
};

// One request of `context` random tokens at batch 1, prefilled, with its memory measured; its
// decode steps are timed by RunCostContext, interleaved with the other configurations'.
struct LongRun {
  std::unique_ptr<Generator> gen;
  CostRow row;
  std::vector<double> step_ms;
};

absl::StatusOr<LongRun> StartLong(const std::string& model, const GeneratorOptions& options,
                                  int context, int decode_tokens) {
  LongRun run;
  ASSIGN_OR_RETURN(run.gen, Generator::Create(model, options));
  Generator& gen = *run.gen;
  std::mt19937 rng(7);
  GenerationRequest r;
  for (int i = 0; i < context; ++i) {
    r.prompt.push_back(std::uniform_int_distribution<int32_t>(3, 500)(rng));
  }
  r.sampling.temperature = 0;
  r.stopping.max_tokens = decode_tokens + 1;
  r.stopping.ignore_eos = true;
  RETURN_IF_ERROR(gen.Add(std::move(r)).status());
  std::vector<SequenceOutput> outs;
  while (gen.HasWork() && outs.empty()) RETURN_IF_ERROR(gen.Step(&outs));  // prefill
  CostRow& row = run.row;
  const ModelConfig& c = gen.model_config();
  row.device_kv_bytes =
      static_cast<int64_t>(gen.kv_pool().used_blocks()) * gen.kv_pool().bytes_per_block();
  if (SparseKvCache* s = gen.sparse_cache()) {
    row.index_bytes = static_cast<int64_t>(s->index_bytes_per_page()) *
                      ((context + kPageSize - 1) / kPageSize) * c.num_hidden_layers *
                      c.num_key_value_heads;
    row.host_capacity_bytes = static_cast<int64_t>(s->store().bytes());
    row.host_bytes_per_token = static_cast<int64_t>(s->store().bytes_per_token());
    row.index_fraction_of_k = static_cast<double>(s->index_bytes_per_page()) /
                              (static_cast<double>(s->store().page_bytes()) / 2);
    row.host_rss_bytes = ResidentBytes(s->store().data(), s->store().bytes());
  }
  return run;
}

// One decode step of `run`, timed.
absl::Status TimeStep(LongRun& run) {
  std::vector<SequenceOutput> outs;
  const auto t0 = Clock::now();
  RETURN_IF_ERROR(run.gen->Step(&outs));
  run.step_ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - t0).count());
  return absl::OkStatus();
}

// One context of the cost table in one KV dtype: the dense row, then a sparse row per budget.
// Every configuration is prefilled first, then their decode steps run in turn, 16 at a time
// (dense, each budget, dense, ...), so that this shared machine's slow moments hit all of them
// alike; each reports its median step. False when a run failed (reported on stderr).
bool RunCostContext(const std::string& model, const SparseBenchOptions& o, const std::string& dtype,
                    int ctx, double* index_fraction) {
  const int64_t total = ctx + o.tbt_decode_tokens + 64;
  std::vector<std::string> names = {"dense"};
  std::vector<GeneratorOptions> configs = {BaseOptions(o.threads, total, 1, dtype)};
  // A full budget too, covering every token the run will hold: every page resident and taken
  // (no scoring: nothing to rank), the selection's lists still built each step, so its ratio to
  // dense is the sparse step's fixed cost (issue 37, item 2).
  for (double f : o.budgets) {
    GeneratorOptions g = BaseOptions(o.threads, total, 1, dtype);
    g.sparse = Sparse(f >= 1.0 ? total : BudgetTokens(f, ctx), SpeculationMode::kCrossStep, o);
    g.host_capacity_tokens = total;
    names.push_back("sparse " + BudgetName(f));
    configs.push_back(g);
  }
  std::vector<LongRun> runs;
  for (size_t i = 0; i < configs.size(); ++i) {
    auto run = StartLong(model, configs[i], ctx, o.tbt_decode_tokens);
    if (!run.ok()) {
      std::cerr << "specula-bench sparse: " << names[i] << " " << ctx << " " << dtype << ": "
                << run.status() << "\n";
      return false;
    }
    runs.push_back(std::move(*run));
  }
  // In blocks of 16 steps, so each configuration's working set is warm in the caches as it
  // would be alone, while a slow minute still spreads over all of them.
  constexpr int kBlock = 16;
  for (int done = 0; done < o.tbt_decode_tokens; done += kBlock) {
    for (LongRun& run : runs) {
      for (int step = done; step < std::min(done + kBlock, o.tbt_decode_tokens); ++step) {
        if (absl::Status s = TimeStep(run); !s.ok()) {
          std::cerr << "specula-bench sparse: " << ctx << " " << dtype << ": " << s << "\n";
          return false;
        }
      }
    }
  }
  const double dense_ms = Median(runs[0].step_ms);
  std::cout << absl::StrFormat("| %d | %s | dense | %.3f | 1 | %.2f | - | - | - | - |\n", ctx,
                               dtype, dense_ms, runs[0].row.device_kv_bytes / 1e6);
  // Device KV of a sparse request: its working set (budget + sinks + window + prefetch
  // slots); the selection index is quest's per-page min/max, 2 / page_size of K.
  for (size_t i = 1; i < runs.size(); ++i) {
    CostRow& r = runs[i].row;
    SparseKvCache* s = runs[i].gen->sparse_cache();
    r.host_rss_bytes =
        std::max(r.host_rss_bytes, ResidentBytes(s->store().data(), s->store().bytes()));
    *index_fraction = r.index_fraction_of_k;
    const double ms = Median(runs[i].step_ms);
    std::cout << absl::StrFormat(
        "| %d | %s | %s | %.3f | %.2f | %.2f | %.3f | %d | %.1f | %.1f |\n", ctx, dtype, names[i],
        ms, ms / dense_ms, r.device_kv_bytes / 1e6, r.index_bytes / 1e6, r.host_bytes_per_token,
        r.host_rss_bytes / 1e6, r.host_capacity_bytes / 1e6);
  }
  return true;
}

int RunCost(const SparseBenchOptions& o) {
  const fs::path work = o.work_dir.empty()
                            ? fs::temp_directory_path() / absl::StrCat("specula-sparse-", getpid())
                            : fs::path(o.work_dir);
  int max_context = 0;
  for (int c : o.tbt_contexts) max_context = std::max(max_context, c);
  TinyModelOptions t;
  t.out_dir = (work / "tiny-long").string();
  t.arch = TinyArch::kLlama;
  t.preset = "tiny";
  t.max_position_embeddings = max_context + o.tbt_decode_tokens + 64;
  if (absl::Status s = WriteTinyModel(t); !s.ok()) {
    std::cerr << "specula-bench sparse: " << s << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
                   "### Cost at long context (generated tiny llama: 2 layers, 4 heads, 2 KV "
                   "heads, head_dim 16; batch 1; selector quest, cross_step, miss_policy %s; the "
                   "configurations decode in turn, median step)\n\n",
                   PolicyName(o))
            << "| context | KV dtype | run | TBT ms (median) | TBT / dense | device KV MB | "
               "selection index MB | host KV bytes/token | host store RSS MB | host capacity MB "
               "|\n|---|---|---|---|---|---|---|---|---|---|\n";
  int rc = 0;
  double index_fraction = 0;
  for (const std::string& dtype : o.kv_dtypes) {
    for (int ctx : o.tbt_contexts) {
      if (!RunCostContext(t.out_dir, o, dtype, ctx, &index_fraction)) rc = 1;
    }
  }
  std::cout << absl::StrFormat(
      "\nSelection index (quest: per-page min and max of K) = %.1f%% of K's bytes.\n\n",
      100.0 * index_fraction);
  if (o.work_dir.empty()) fs::remove_all(work);
  return rc;
}

}  // namespace

int RunSparseBench(const SparseBenchOptions& o) {
  int rc = 0;
  if (!o.retrieval_dir.empty()) rc = RunQuality(o);
  if (!o.tbt_contexts.empty()) rc = std::max(rc, RunCost(o));
  return rc;
}

}  // namespace specula
