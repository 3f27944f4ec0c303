#include "engine/generate/sequence.h"

#include <algorithm>

#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

Sequence::Sequence(uint64_t id, GenerationRequest request, const Tokenizer& tokenizer,
                   absl::flat_hash_set<int32_t> eos_ids, int64_t max_context,
                   grammar::TokenMasker* masker, MaskCaches* mask_caches)
    : id_(id),
      request_(std::move(request)),
      max_context_(max_context),
      sampler_(request_.sampling, request_.prompt),
      detok_(tokenizer, /*skip_special_tokens=*/true),
      stops_(request_.stopping.stop) {
  prefill_target_ = static_cast<int64_t>(request_.prompt.size());
  // Room for the output up front (up to kReservedOutputTokens), so decode does not grow it step
  // by step.
  generated_.reserve(static_cast<size_t>(
      std::clamp<int64_t>(request_.stopping.max_tokens, 0, kReservedOutputTokens)));
  if (!request_.stopping.ignore_eos) stop_ids_ = std::move(eos_ids);
  stop_ids_.insert(request_.stopping.stop_token_ids.begin(),
                   request_.stopping.stop_token_ids.end());
  if (!request_.constraint.empty()) {
    CHECK(masker != nullptr && mask_caches != nullptr);
    constraint_ = std::make_unique<OutputConstraint>(request_.constraint, *masker, *mask_caches,
                                                     tokenizer, stop_ids_);
  }
}

int32_t Sequence::TokenAt(int64_t i) const {
  const int64_t n_prompt = static_cast<int64_t>(request_.prompt.size());
  return i < n_prompt ? request_.prompt[i] : generated_[i - n_prompt];
}

void Sequence::AdvanceKv(int64_t n, bool prefill) {
  kv_len_ += n;
  if (prefill) prefilled_ += n;
  CHECK_LE(kv_len_, num_tokens());
}

void Sequence::SkipCachedPrefix(int64_t tokens) {
  CHECK(kv_len_ == 0 && tokens >= 0 && tokens < prefill_target_);
  prefilled_ = kv_len_ = tokens;
  if (preemptions_ == 0) cached_prompt_tokens_ = tokens;
}

void Sequence::Preempt() {
  CHECK(!finished() && !preempted_);
  prefill_target_ = num_tokens();
  prefilled_ = kv_len_ = 0;
  blocks_.clear();
  preempted_ = true;
  ++preemptions_;
}

int64_t MaxTotalTokens(const GenerationRequest& request, int64_t max_context) {
  return std::min<int64_t>(
      max_context, static_cast<int64_t>(request.prompt.size()) + request.stopping.max_tokens);
}

int64_t Sequence::max_total_tokens() const { return MaxTotalTokens(request_, max_context_); }

absl::Status Sequence::Accept(absl::Span<float> logits, SequenceOutput* out) {
  CHECK(!finished());
  if (constraint_ != nullptr) RETURN_IF_ERROR(constraint_->Mask(logits));
  const SampledToken s = sampler_.Sample(logits);
  if (constraint_ != nullptr) RETURN_IF_ERROR(constraint_->Accept(s.token));
  Take(s, out);
  return absl::OkStatus();
}

absl::Status Sequence::AcceptSampled(const SampledRow& row, SequenceOutput* out) {
  CHECK(!finished());
  const SampledToken s = sampler_.Record(row);
  if (constraint_ != nullptr) RETURN_IF_ERROR(constraint_->Accept(s.token));
  Take(s, out);
  return absl::OkStatus();
}

void Sequence::Take(SampledToken s, SequenceOutput* out) {
  generated_.push_back(s.token);
  out->tokens.push_back(s.token);
  if (request_.sampling.logprobs >= 0) out->logprobs.push_back(s);

  if (stop_ids_.contains(s.token)) {
    finish_ = FinishReason::kStop;
  } else {
    StopMatcher::Result r = stops_.Push(detok_.Push(s.token));
    out->text += r.text;
    if (r.stopped) finish_ = FinishReason::kStopSequence;
  }
  // A complete structured output ends the request: nothing else may follow.
  if (!finished() && constraint_ != nullptr && constraint_->complete())
    finish_ = FinishReason::kStop;
  if (!finished() && (static_cast<int64_t>(generated_.size()) >= request_.stopping.max_tokens ||
                      num_tokens() >= max_context_)) {
    finish_ = FinishReason::kLength;
  }
  if (finish_ == FinishReason::kStop || finish_ == FinishReason::kLength) {
    out->text += stops_.Push(detok_.Finish()).text;
    out->text += stops_.Flush();
  }
  out->finish = finish_;
}

void Sequence::Finish(FinishReason reason, SequenceOutput* out) {
  finish_ = reason;
  out->finish = reason;
}

}  // namespace specula
