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
// A step of decode rows only, all dense and sampled on the device, is recorded on its first run
// (Backend::Record: a CUDA graph) and replayed as one launch by later steps of the same rows and
// keys capacity (the next power of two of the longest context, at least 256): such steps plan
// the same metadata layout and launch shapes, and only the uploaded metadata differs. Steps with
// prefill chunks, sparse sequences (or with a sparse cache at all), host sampling, or on a
// backend that cannot record run each operation as it is enqueued.
//
// The token masks of rows whose output grammar holds are prepared on the MaskWorker's thread
// while the forward pass runs (started in Run), so sampling finds them ready. On the device path
// the masks are uploaded as bits once the forward pass is enqueued and applied to the logits
// there (Backend::MaskLogits) before SampleRows: a constrained row samples on the device and
// its logits are never read back. Steps with masks are not recorded.
//
// Engine thread only. Scheduling (which rows run) is the caller's.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/generate/mask_worker.h"
#include "engine/generate/scheduled_step.h"
#include "engine/generate/sequence.h"
#include "engine/generate/sparse_prefill.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/sparse_kv_cache.h"
#include "engine/model/transformer.h"

namespace specula {

class ModelRunner {
 public:
  // `sparse` is null without a sparse cache; `masks` prepares constrained rows' masks. All must
  // outlive the runner. `record_decode_steps`: replay recorded decode steps where the backend can
  // (model.cuda_graphs).
  ModelRunner(Backend& backend, Transformer& model, DenseKvAttention& dense, SparseKvCache* sparse,
              MaskWorker& masks, bool record_decode_steps = true);

  // The step's metadata. The caller clears it, lets the KV managers plan into it, then calls
  // Plan.
  StepPlan& plan() { return plan_; }

  // Writes the step's rows and sampling settings into the plan and uploads it; marks the layer-
  // major prefill's row as sampled when it finishes this step. RESOURCE_EXHAUSTED when the plan
  // cannot grow.
  absl::Status Plan(ScheduledStep& step);
  // Starts preparing the masks of the sampled rows whose grammar holds, then enqueues the forward
  // pass, the layer-major prefill's units and the device sampling.
  void Run(const ScheduledStep& step);
  // The step's one synchronization: the sampled tokens or the logits come back (a plain wait when
  // nothing samples), and the masks Run started are ready.
  void ReadResults();
  // The i-th sampled row's token into `seq` (i in `rows` order among rows that sample). INTERNAL,
  // with nothing accepted, when the row's logits were NaN or infinite.
  absl::Status Accept(size_t i, Sequence& seq, SequenceOutput* out);

  // Whether the last step sampled on the device (false when nothing sampled).
  bool sampled_on_device() const { return on_device_ && sampled_rows_ > 0; }
  // Whether the last step was a replay of a recorded step.
  bool replayed() const { return replayed_; }

 private:
  // Each sampled row's settings (drawing their uniforms) when all can sample on the device.
  void PlanSampling(const ScheduledStep& step);
  // The keys capacity when the step is decode rows only, all dense; else 0.
  static int32_t DecodeOnlyKeysCapacity(const ScheduledStep& step);
  // Enqueues the step's operations one by one.
  void Enqueue(const ScheduledStep& step);
  // Waits for them, uploads them as bits and masks their rows' logits on the backend.
  void ApplyDeviceMasks();
  // Replays the step's recording, else enqueues the step and records it for the next.
  void RunRecorded(const ScheduledStep& step);

  // Steps that plan the same layout replay the same recording. The plan's and the model's
  // buffer generations are part of it: a buffer that moved invalidates what was recorded.
  struct StepShape {
    int32_t rows = 0;
    int32_t keys_capacity = 0;
    size_t staged_bytes = 0;
    uint64_t plan_generation = 0;
    uint64_t workspace_generation = 0;
    bool operator==(const StepShape&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const StepShape& s) {
      return H::combine(std::move(h), s.rows, s.keys_capacity, s.staged_bytes, s.plan_generation,
                        s.workspace_generation);
    }
  };
  // Recordings kept at most (batch sizes x context doublings seen): past it, those into moved
  // buffers go, then the least recently used.
  static constexpr size_t kMaxRecordings = 128;
  void MakeRoomForRecording(const StepShape& current);
  struct Recording {
    std::unique_ptr<RecordedOps> ops;  // null where recording failed
    int64_t last_used = 0;             // in recorded-shape steps
  };

  Backend& backend_;
  Transformer& model_;
  DenseKvAttention& dense_;
  SparseKvCache* sparse_;
  MaskWorker& masks_;
  // The step's sampled rows whose grammar holds: their constraints and their indices among the
  // sampled rows (their logits rows); a row whose mask allowed nothing fails with its status.
  std::vector<OutputConstraint*> holding_;
  std::vector<int32_t> holding_rows_;
  std::vector<std::pair<size_t, absl::Status>> mask_failures_;
  StepPlan mask_plan_;  // the device masks' bits, uploaded after the forward pass is enqueued
  StepPlan plan_;
  int64_t sampled_rows_ = 0;
  bool on_device_ = false;
  std::vector<RowSampling> settings_;
  PlanSlice<RowSampling> settings_slice_;
  PlanSlice<SampledRow> results_slice_;
  std::vector<SampledRow> results_;  // device sampling's results, read back
  std::vector<float> logits_;        // host sampling's logits, read back

  bool record_decode_steps_;
  // Decode-only steps plan for a keys capacity: where they may be recorded (no sparse cache, a
  // backend that records), cuda_graphs on or off alike.
  bool plan_by_capacity_;
  int32_t keys_capacity_ = 0;  // this step's, when it is decode rows only
  bool recordable_ = false;    // this step may replay or be recorded
  bool replayed_ = false;
  absl::flat_hash_map<StepShape, Recording> recordings_;
  int64_t steps_ = 0;  // steps of recordable shape so far
};

}  // namespace specula
