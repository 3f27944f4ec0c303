// The sparse cache's decode rows behind the model's KV seam (engine/model/kv_attention.h): per
// step the host plans each sparse decode row once (its position, the pages leaving the window,
// where its scores and attend lists go); per layer it only enqueues device operations
// (engine/backend/sparse_ops.h):
//   retire window pages -> write K/V -> write back and summarize completed pages ->
//   score candidates -> select (hit / late / missed; attend lists; stage the next step's pages)
//   -> a copy stream gathers what was staged -> sparse attention.
// With cross_layer, PredictLayer scores and stages the next layer's pages from an early query.
// Counters come back with the step's one readback (EndStep, then FinishStep after the sync).
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/kv/counter_readback.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/page_prefetcher.h"
#include "engine/kv/selection_index.h"
#include "engine/kv/sparse_options.h"
#include "engine/kv/working_set.h"
#include "engine/model/kv_attention.h"

namespace specula {

struct SparseModelShape {
  int32_t layers = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  float softmax_scale = 0;  // ModelConfig::softmax_scale()
};

// A sparse sequence decoding one token in this step: batch row `q_row`, position `pos`.
struct SparseDecodeRow {
  WorkingSet* ws = nullptr;
  int32_t q_row = 0;
  int32_t pos = 0;
};

// Attention recall of the selected tokens, measured against exact attention (evaluation only).
struct RecallProbe {
  double mass_sum = 0;  // Σ over (row, query head, layer) of the attention mass attended
  int64_t samples = 0;
};

// What one decode attention reads, for tests that check slot contents (invariant 2). The
// spans point at the device-written lists: readable on the CPU backend only.
struct AttendedPages {
  int32_t layer = 0;
  bool after = false;  // called once before the attention reads them and once after
  std::vector<const WorkingSet*> rows;
  std::vector<int32_t> positions;
  absl::Span<const int32_t> list_begin;  // [rows * kv_heads]
  absl::Span<const int32_t> list_count;
  absl::Span<const int32_t> pages;  // HostPageRef(host page) or device pool page ids
  absl::Span<const int32_t> tokens;
};

class SparseDecodeKv : public KvAttention {
 public:
  // Everything must outlive this object.
  SparseDecodeKv(const SparseOptions& options, const SparseModelShape& shape, Backend& backend,
                 KvPool& device, HostKvStore& store, SelectionIndex& index,
                 PagePrefetcher& prefetcher);

  // Plans the step's decode rows (contiguous in the batch from rows[0].q_row). Advances each
  // working set's decode step and window. Call before plan.Upload(); nothing else may plan
  // prefetcher staging in the same step.
  absl::Status Plan(absl::Span<const SparseDecodeRow> rows, StepPlan& plan);
  // After plan.Upload().
  void Bind(const StepPlan& plan);
  bool empty() const { return rows_.empty(); }

  void Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) override;
  RowRange EarlyQueryRows() const override;
  void PredictLayer(int32_t layer, const Mat& q) override;

  // After the last layer: enqueues the counters' readback (no wait).
  void EndStep();
  // After the step's synchronization: adds the counters to each request's stats and `step`;
  // `stall_seconds` (the prefetcher's waits this step) delayed every row.
  void FinishStep(SparseStepStats* step, double stall_seconds);

  void set_recall_probe(RecallProbe* probe) { recall_ = probe; }
  void set_attention_observer(std::function<void(const AttendedPages&)> observer) {
    observer_ = std::move(observer);
  }

 private:
  bool deferred() const { return options_.miss_policy == MissPolicy::kDefer; }
  SparseScoreArgs ScoreArgs(int32_t layer) const;
  SparseSelectArgs SelectArgs(int32_t layer, SelectMode mode) const;
  void Observe(int32_t layer, bool after);
  void MeasureRecall(int32_t layer, const Mat& q);

  SparseOptions options_;
  SparseModelShape shape_;
  Backend& backend_;
  KvPool& device_;
  HostKvStore& store_;
  SelectionIndex& index_;
  PagePrefetcher& prefetcher_;

  // This step's plan.
  std::vector<SparseDecodeRow> rows_;
  int32_t first_row_ = 0;
  bool any_retire_ = false;
  bool any_complete_ = false;
  bool any_scoring_ = false;
  bool any_layer_prediction_ = false;
  int32_t max_candidates_ = 0;
  int32_t max_list_ = 0;
  int32_t max_slots_ = 1;  // the most cache slots of any row
  PlanSlice<SparseRowPlan> plan_rows_;
  PlanSlice<int32_t> write_blocks_, write_offsets_, list_begin_;
  PlanSlice<float> scores_;
  PlanSlice<int32_t> list_pages_, list_tokens_, list_count_;
  // Bound after Upload.
  DeviceSpan<const SparseRowPlan> d_rows_;
  DeviceSpan<float> d_scores_;
  DeviceSpan<int32_t> d_list_pages_, d_list_tokens_, d_list_count_;
  DeviceSpan<const int32_t> d_list_begin_, d_write_blocks_, d_write_offsets_;
  CounterReadback counters_;  // [rows][kv_heads][kSparseCounterCount]

  RecallProbe* recall_ = nullptr;
  std::function<void(const AttendedPages&)> observer_;
};

}  // namespace specula
