// Runs one scheduled step on the backend (the runner of docs/ARCHITECTURE.md's engine loop): writes
// the step's metadata into the step plan and uploads it, enqueues the forward pass and a
// layer-major prefill's units, turns the sampled rows' logits into tokens and hands each to its
// sequence.
//
// Sampling happens on the device (Backend::SampleRows) when every sampled row of the step allows
// it (no penalties): then only tokens and logprobs are read back, O(rows). Otherwise the step's
// logits are read back and sampled on the host, as one row with a penalty needs its token counts.
// Either way a step reads back once and synchronizes once, and a sequence draws one uniform per
// stochastic step from its own stream, so its tokens do not depend on which way its batch went.
//
// Engine thread only. Scheduling (which rows run) is the caller's.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/generate/sequence.h"
#include "engine/generate/sparse_prefill.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/sparse_kv_cache.h"
#include "engine/model/transformer.h"

namespace specula {

// A sequence's part in a step.
struct ScheduledRow {
  Sequence* seq = nullptr;
  int64_t n = 0;  // tokens through the batched forward pass (0 for a layer-major prefill)
  bool prefill = false;
  bool sample = false;  // has a logit row (in `rows` order)
};

// What one step runs, as the scheduler chose it.
struct ScheduledStep {
  std::vector<ScheduledRow> rows;
  std::vector<int32_t> tokens, positions, logit_rows;  // of the batched forward pass
  std::vector<DenseSeqRows> dense;                     // rows [0, dense rows)
  std::vector<SparseDecodeRow> sparse_decode;          // after them
  SparsePrefill* sparse_prefill = nullptr;             // this step's layer-major prefill
  Sequence* sparse_prefill_seq = nullptr;
  int64_t sparse_layer_tokens = 0;
  PlanSlice<int32_t> tokens_slice, positions_slice, logit_rows_slice;
};

class ModelRunner {
 public:
  // `sparse` is null without a sparse cache. All must outlive the runner.
  ModelRunner(Backend& backend, Transformer& model, DenseKvAttention& dense, SparseKvCache* sparse);

  // The step's metadata. The caller clears it, lets the KV managers plan into it, then calls
  // Plan.
  StepPlan& plan() { return plan_; }

  // Writes the step's rows and sampling settings into the plan and uploads it; marks the layer-
  // major prefill's row as sampled when it finishes this step. RESOURCE_EXHAUSTED when the plan
  // cannot grow.
  absl::Status Plan(ScheduledStep& step);
  // Enqueues the forward pass, the layer-major prefill's units and the device sampling.
  void Run(const ScheduledStep& step);
  // The step's one synchronization: the sampled tokens or the logits come back (a plain wait when
  // nothing samples).
  void ReadResults();
  // The i-th sampled row's token into `seq` (i in `rows` order among rows that sample). INTERNAL,
  // with nothing accepted, when the row's logits were NaN or infinite.
  absl::Status Accept(size_t i, Sequence& seq, SequenceOutput* out);

  // Whether the last step sampled on the device (false when nothing sampled).
  bool sampled_on_device() const { return on_device_ && sampled_rows_ > 0; }

 private:
  // Each sampled row's settings (drawing their uniforms) when all can sample on the device.
  void PlanSampling(const ScheduledStep& step);

  Backend& backend_;
  Transformer& model_;
  DenseKvAttention& dense_;
  SparseKvCache* sparse_;
  StepPlan plan_;
  int64_t sampled_rows_ = 0;
  bool on_device_ = false;
  std::vector<RowSampling> settings_;
  PlanSlice<RowSampling> settings_slice_;
  PlanSlice<SampledRow> results_slice_;
  std::vector<SampledRow> results_;  // device sampling's results, read back
  std::vector<float> logits_;        // host sampling's logits, read back
};

}  // namespace specula
