#include "engine/generate/model_runner.h"

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
                         SparseKvCache* sparse)
    : backend_(backend), model_(model), dense_(dense), sparse_(sparse), plan_(backend) {}

absl::Status ModelRunner::Plan(ScheduledStep& step) {
  dense_.Plan(step.dense, plan_);
  if (sparse_ != nullptr) RETURN_IF_ERROR(sparse_->decode().Plan(step.sparse_decode, plan_));
  if (step.sparse_prefill != nullptr) {
    RETURN_IF_ERROR(step.sparse_prefill->Plan(step.sparse_layer_tokens, plan_));
    if (step.sparse_prefill->finishes_this_step()) step.rows.back().sample = true;
  }
  step.tokens_slice = plan_.Add<int32_t>(step.tokens);
  step.positions_slice = plan_.Add<int32_t>(step.positions);
  step.logit_rows_slice = plan_.Add<int32_t>(step.logit_rows);
  PlanSampling(step);
  return plan_.Upload();
}

void ModelRunner::PlanSampling(const ScheduledStep& step) {
  sampled_rows_ = 0;
  on_device_ = true;
  for (const ScheduledRow& row : step.rows) {
    if (!row.sample) continue;
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

void ModelRunner::Run(const ScheduledStep& step) {
  if (sparse_ != nullptr) sparse_->RunPendingSummaries(plan_);
  dense_.Bind(plan_);
  if (sparse_ != nullptr) sparse_->decode().Bind(plan_);
  if (step.sparse_prefill != nullptr) step.sparse_prefill->Bind(plan_);
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
}

absl::Status ModelRunner::Accept(size_t i, Sequence& seq, SequenceOutput* out) {
  CHECK_LT(static_cast<int64_t>(i), sampled_rows_);
  if (on_device_) {
    if (results_[i].status != RowSampleStatus::kOk) return NonFiniteLogits();
    return seq.AcceptSampled(results_[i], out);
  }
  const int64_t vocab = model_.config().vocab_size;
  const absl::Span<float> row(logits_.data() + static_cast<int64_t>(i) * vocab, vocab);
  if (!AllFinite(row)) return NonFiniteLogits();
  return seq.Accept(row, out);
}

}  // namespace specula
