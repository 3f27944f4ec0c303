#include "engine/generate/model_runner.h"

#include <algorithm>
#include <bit>

#include "engine/common/status_macros.h"
#include "engine/kv/sparse_decode.h"
#include "engine/sampling/row_sampling.h"

namespace specula {
namespace {

absl::Status NonFiniteLogits() {
  return absl::InternalError(
      "the model produced non-finite logits (NaN or Inf) for this request; its KV cache was "
      "discarded");
}

}  // namespace

ModelRunner::ModelRunner(Backend& backend, Transformer& model, DenseKvAttention& dense,
                         SparseKvCache* sparse, MaskWorker& masks, bool record_decode_steps)
    : backend_(backend),
      model_(model),
      dense_(dense),
      sparse_(sparse),
      masks_(masks),
      mask_plan_(backend),
      plan_(backend),
      record_decode_steps_(record_decode_steps),
      plan_by_capacity_(sparse == nullptr && backend.can_record()) {}

int32_t ModelRunner::DecodeOnlyKeysCapacity(const ScheduledStep& step) {
  if (step.dense.empty() || !step.sparse_decode.empty() || step.sparse_prefill != nullptr) return 0;
  uint32_t max_keys = 256;  // the least capacity
  for (const DenseSeqRows& s : step.dense) {
    if (s.q_len != 1) return 0;
    max_keys = std::max(max_keys, static_cast<uint32_t>(s.kv_len));
  }
  return static_cast<int32_t>(std::bit_ceil(max_keys));
}

absl::Status ModelRunner::Plan(ScheduledStep& step) {
  // Where steps may be recorded, decode-only steps plan by capacity whether or not recording is
  // on, so that a replay and an enqueued run of the same step launch the same kernels and give
  // the same bytes.
  keys_capacity_ = plan_by_capacity_ ? DecodeOnlyKeysCapacity(step) : 0;
  dense_.Plan(step.dense, plan_, keys_capacity_);
  if (sparse_ != nullptr) RETURN_IF_ERROR(sparse_->decode().Plan(step.sparse_decode, plan_));
  if (step.sparse_prefill != nullptr) {
    RETURN_IF_ERROR(step.sparse_prefill->Plan(step.sparse_layer_tokens, plan_));
    if (step.sparse_prefill->finishes_this_step()) step.rows.back().sample = true;
  }
  step.tokens_slice = plan_.Add<int32_t>(step.tokens);
  step.positions_slice = plan_.Add<int32_t>(step.positions);
  step.logit_rows_slice = plan_.Add<int32_t>(step.logit_rows);
  PlanSampling(step);
  RETURN_IF_ERROR(plan_.Upload());
  recordable_ = record_decode_steps_ && keys_capacity_ > 0 && on_device_ && holding_.empty() &&
                sampled_rows_ == static_cast<int64_t>(step.tokens.size());
  return absl::OkStatus();
}

void ModelRunner::PlanSampling(const ScheduledStep& step) {
  sampled_rows_ = 0;
  on_device_ = true;
  holding_.clear();
  holding_rows_.clear();
  mask_failures_.clear();
  for (const ScheduledRow& row : step.rows) {
    if (!row.sample) continue;
    if (OutputConstraint* c = row.seq->holding_constraint()) {
      holding_.push_back(c);
      holding_rows_.push_back(static_cast<int32_t>(sampled_rows_));
    }
    ++sampled_rows_;
    on_device_ = on_device_ && row.seq->CanSampleOnDevice();
  }
  if (!on_device_ || sampled_rows_ == 0) return;
  // Drawn only once the whole step is known to sample here: a host step draws in Sample.
  settings_.clear();
  for (const ScheduledRow& row : step.rows) {
    if (row.sample) settings_.push_back(row.seq->NextDeviceRow());
  }
  settings_slice_ = plan_.Add<RowSampling>(settings_);
  results_slice_ = plan_.Scratch<SampledRow>(settings_.size());
}

void ModelRunner::ApplyDeviceMasks() {
  masks_.Wait();
  const int64_t vocab = model_.config().vocab_size;
  const size_t words = static_cast<size_t>((vocab + 31) / 32);
  mask_plan_.Clear();
  const PlanSlice<int32_t> rows = mask_plan_.Add<int32_t>(holding_rows_);
  const PlanSlice<uint32_t> bits = mask_plan_.Reserve<uint32_t>(holding_.size() * words);
  uint32_t* host = mask_plan_.Host(bits);
  for (size_t i = 0; i < holding_.size(); ++i) {
    const absl::Span<uint32_t> row(host + i * words, words);
    if (absl::Status s = holding_[i]->WriteMask(row, vocab); !s.ok()) {
      mask_failures_.emplace_back(static_cast<size_t>(holding_rows_[i]), std::move(s));
      std::fill(row.begin(), row.end(), ~uint32_t{0});  // the row fails; its draw is moot
    }
  }
  if (absl::Status s = mask_plan_.Upload(); !s.ok()) {
    for (int32_t r : holding_rows_) mask_failures_.emplace_back(static_cast<size_t>(r), s);
    return;
  }
  backend_.MaskLogits(model_.logits(sampled_rows_), mask_plan_.Device(rows),
                      mask_plan_.Device(bits));
}

void ModelRunner::Run(const ScheduledStep& step) {
  replayed_ = false;
  masks_.Start(holding_);  // while the forward pass runs
  if (sparse_ != nullptr) sparse_->RunPendingSummaries(plan_);
  dense_.Bind(plan_);
  if (sparse_ != nullptr) sparse_->decode().Bind(plan_);
  if (step.sparse_prefill != nullptr) step.sparse_prefill->Bind(plan_);
  if (recordable_) {
    RunRecorded(step);
  } else {
    Enqueue(step);
  }
}

void ModelRunner::RunRecorded(const ScheduledStep& step) {
  const StepShape shape{static_cast<int32_t>(step.tokens.size()), keys_capacity_,
                        plan_.staged_bytes(), plan_.generation(), model_.workspace_generation()};
  ++steps_;
  if (auto it = recordings_.find(shape); it != recordings_.end()) {
    it->second.last_used = steps_;
    if (it->second.ops == nullptr) return Enqueue(step);  // could not be recorded
    if (it->second.ops->Replay()) {
      replayed_ = true;
      return;
    }
  }
  Enqueue(step);
  MakeRoomForRecording(shape);
  recordings_[shape] = Recording{backend_.Record([&] { Enqueue(step); }), steps_};
}

void ModelRunner::MakeRoomForRecording(const StepShape& current) {
  if (recordings_.size() < kMaxRecordings) return;
  // Recordings into buffers that have moved since can never replay again.
  absl::erase_if(recordings_, [&](const auto& entry) {
    return entry.first.plan_generation != current.plan_generation ||
           entry.first.workspace_generation != current.workspace_generation;
  });
  if (recordings_.size() < kMaxRecordings) return;
  auto oldest = std::min_element(
      recordings_.begin(), recordings_.end(),
      [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
  recordings_.erase(oldest);
}

void ModelRunner::Enqueue(const ScheduledStep& step) {
  const auto n = static_cast<int64_t>(step.tokens.size());
  if (n > 0) {
    StepAttention attention(&dense_, sparse_ != nullptr ? &sparse_->decode() : nullptr);
    model_.Forward(plan_.Device(step.tokens_slice), plan_.Device(step.positions_slice), attention);
    model_.Logits(model_.hidden(n), plan_.Device(step.logit_rows_slice), 0);
  }
  if (step.sparse_prefill != nullptr) {
    step.sparse_prefill->Run(static_cast<int64_t>(step.logit_rows.size()));
  }
  if (on_device_ && sampled_rows_ > 0) {
    if (!holding_.empty()) ApplyDeviceMasks();
    backend_.SampleRows(model_.logits(sampled_rows_), plan_.Device(settings_slice_),
                        plan_.Device(results_slice_));
  }
}

void ModelRunner::ReadResults() {
  if (sampled_rows_ == 0) {
    backend_.Synchronize();
  } else if (on_device_) {
    results_.resize(static_cast<size_t>(sampled_rows_));
    const DeviceSpan<SampledRow> device = plan_.Device(results_slice_);
    backend_.CopyToHost(results_.data(), device.data(), device.bytes());
  } else {
    model_.ReadLogits(sampled_rows_, &logits_);
  }
  masks_.Wait();  // the host path's masks (the device path waited before MaskLogits)
}

absl::Status ModelRunner::Accept(size_t i, Sequence& seq, SequenceOutput* out) {
  CHECK_LT(static_cast<int64_t>(i), sampled_rows_);
  if (on_device_) {
    for (const auto& [row, status] : mask_failures_) {
      if (row == i) return status;
    }
    if (results_[i].status != RowSampleStatus::kOk) return NonFiniteLogits();
    return seq.AcceptSampled(results_[i], out);
  }
  const int64_t vocab = model_.config().vocab_size;
  const absl::Span<float> row(logits_.data() + static_cast<int64_t>(i) * vocab, vocab);
  if (!LogitsSampleable(row)) return NonFiniteLogits();
  return seq.Accept(row, out);
}

}  // namespace specula
