// What makes a prefilled layer of a sparse sequence ready to decode (docs/SPARSE_KV.md): the
// summaries of its new full pages (quest), the sinks and the recent window in their slots, and
// the first decode step's pages staged on a copy stream (cross_step: ranked by the last prompt
// row's query) or, when the budget covers every candidate, loaded at once. All on the device,
// per layer, as each layer's prefill ends (engine/generate/sparse_prefill.h).
//
// Per step: Plan (the layers ending in it), Bind, Run per layer, EndStep, then FinishStep after
// the step's synchronization. Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/step_plan.h"
#include "engine/kv/counter_readback.h"
#include "engine/kv/sparse_kv_cache.h"

namespace specula {

// Where a layer's prompt pages are: the host store (ws.host()'s pages), or a buffer holding
// page p of KV head h at index p * kv_heads + h (a layer-major prefill's layer buffer).
struct PromptPages {
  PagePoolView pool;
  bool host_store = false;
};

class DecodeStart {
 public:
  // For `ws`, whose prompt of `prompt_tokens` tokens was prefilled from `cached_tokens` on (the
  // pages before are a cached prefix, summarized already).
  DecodeStart(SparseKvCache& cache, WorkingSet& ws, int64_t prompt_tokens, int64_t cached_tokens);

  absl::Status Plan(absl::Span<const int32_t> layers, StepPlan& plan);
  void Bind(const StepPlan& plan);
  // `last_query`: the last prompt row's queries for `layer` [1, heads * head_dim], RoPE applied.
  void Run(int32_t layer, const PromptPages& pages, const Mat& last_query);
  void EndStep() { counters_.Enqueue(); }
  // After the step's synchronization: pages loaded or staged, into the request's stats and `step`.
  void FinishStep(SparseStepStats* step);

  // Candidate pages at the first decode step.
  int32_t candidates() const;

 private:
  // Run's parts: the sink pages and the recent window into their slots, then the first decode
  // step's pages (all of them when they fit, else staged by the last prompt row's query).
  void LoadSinksAndWindow(int32_t layer, const PromptPages& pages);
  void SelectFirstPages(int32_t layer, const Mat& last_query);

  struct LayerPlan {
    PlanSlice<int32_t>
        summary_pages;               // new full pages' indices (page p of head h: p * kv_heads + h)
    PlanSlice<int32_t> summary_dst;  // their host page ids
  };

  SparseKvCache& cache_;
  WorkingSet& ws_;
  int64_t prompt_tokens_;
  int64_t cached_tokens_;
  std::vector<LayerPlan> layers_;  // by layer, this step's
  PlanSlice<SparseRowPlan> row_;
  PlanSlice<float> scores_;
  CounterReadback counters_;  // [kv_heads][kSparseCounterCount]
  const StepPlan* plan_ = nullptr;
  std::vector<PageCopy> copies_;
};

}  // namespace specula
