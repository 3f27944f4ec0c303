// `specula-bench sparse`: does the sparse KV cache keep quality, and does its cost follow the
// budget? Two parts, both on the in-process engine (CPU backend):
//  - quality: the trained retrieval model (tests/fixtures/retrieval_model) on its eval sets, per
//    context length and budget: answer accuracy, attention recall against exact attention,
//    prefetch hit rate per speculation mode, bytes moved per token, stall time;
//  - cost: a generated small model at long contexts, per KV dtype: time between tokens sparse vs
//    dense at batch 1, device KV bytes per request, host KV bytes per token and the host store's
//    measured RSS.
#pragma once

#include <string>
#include <vector>

#include "engine/kv/sparse_options.h"

namespace specula {

struct SparseBenchOptions {
  std::string retrieval_dir;           // model + eval_<ctx>.json files; "" skips quality
  std::vector<int> contexts;           // eval sets to run (empty: every file found)
  std::vector<double> budgets = {1.0, 0.5, 0.25, 0.125};  // fractions of the context
  std::vector<int> tbt_contexts = {8192, 32768};           // empty skips the cost part
  int tbt_decode_tokens = 32;
  // sparse.prefetch_extra_tokens as a fraction of the budget; < 0: the server's default.
  double prefetch_extra = -1;
  MissPolicy miss_policy = MissPolicy::kAuto;  // sparse.miss_policy of every sparse run
  double miss_correction = SparseOptions().miss_correction;  // sparse.miss_correction (defer)
  // kv_cache.dtype values: the cost part runs each; the quality part the first.
  std::vector<std::string> kv_dtypes = {"f32"};
  int threads = 0;
  std::string work_dir;  // generated model; a temp dir when empty
};

// Prints Markdown tables to stdout; returns a process exit code.
int RunSparseBench(const SparseBenchOptions& options);

}  // namespace specula
