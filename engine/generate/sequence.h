// The state of one generation request inside the engine: its tokens, its KV blocks, its sampler,
// streaming detokenizer and stop matcher. Owned by the Generator (engine thread only).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "engine/generate/output_constraint.h"
#include "engine/grammar/grammar.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/sparse_options.h"
#include "engine/kv/working_set.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_params.h"
#include "engine/sampling/stop_matcher.h"
#include "engine/tokenizer/tokenizer.h"

namespace specula {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingParams sampling;
  StoppingCriteria stopping;
  SparseRequestOptions sparse;
  // A conversation whose KV the engine keeps between requests (docs/SESSIONS.md); empty = none.
  std::string session_id;
  // What the output must follow (structured outputs and strict tool calls,
  // docs/STRUCTURED_OUTPUT.md); empty = nothing. Compiled before the request reaches the engine.
  ConstraintSpec constraint;
};

// The most tokens a request can ever hold: prompt + max_tokens, capped by the model's context.
int64_t MaxTotalTokens(const GenerationRequest& request, int64_t max_context);

enum class FinishReason { kNone, kStop, kLength, kStopSequence, kCancelled };
const char* FinishReasonName(FinishReason r);

// What one step produced for one sequence.
struct SequenceOutput {
  uint64_t id = 0;
  // New token ids: 0 or 1 per step, held inline (an output allocates nothing for its token).
  absl::InlinedVector<int32_t, 1> tokens;
  std::string text;                    // new text, safe to show (complete UTF-8, no stop string)
  std::vector<SampledToken> logprobs;  // per new token, when asked
  FinishReason finish = FinishReason::kNone;
  // Set on a sequence's last output (finished or cancelled): what the KV cache did for it.
  std::optional<KvStats> kv_stats;
  // Not OK when the sequence failed alone (INTERNAL: its logits were NaN or Inf); it is retired,
  // its KV discarded, and `finish` stays kNone.
  absl::Status error;
};

class Sequence {
 public:
  // `masker` and `mask_caches` are needed only when the request has a constraint.
  Sequence(uint64_t id, GenerationRequest request, const Tokenizer& tokenizer,
           absl::flat_hash_set<int32_t> eos_ids, int64_t max_context,
           grammar::TokenMasker* masker = nullptr, MaskCaches* mask_caches = nullptr);

  uint64_t id() const { return id_; }
  const GenerationRequest& request() const { return request_; }
  const std::vector<int32_t>& generated() const { return generated_; }
  // Every token whose K/V is (or is about to be) in the cache, prompt first.
  int64_t num_tokens() const {
    return static_cast<int64_t>(request_.prompt.size() + generated_.size());
  }
  int32_t TokenAt(int64_t i) const;

  // Tokens not yet run through the model before the next sampling: the prompt's, or after a
  // preemption every token so far (the last one's logits give the next token).
  int64_t prefill_remaining() const { return prefill_target_ - prefilled_; }
  bool in_prefill() const { return prefill_remaining() > 0; }
  int64_t kv_len() const { return kv_len_; }
  void AdvanceKv(int64_t n, bool prefill);
  // The first `tokens` tokens' KV came from the prefix cache: prefill starts after them.
  void SkipCachedPrefix(int64_t tokens);
  // The sequence lost its KV to a preemption (Generator::Preempt): it resumes by prefilling every
  // token so far (less what the prefix cache still holds), then decodes on.
  void Preempt();
  bool preempted() const { return preempted_; }
  void set_preempted(bool p) { preempted_ = p; }
  int32_t preemptions() const { return preemptions_; }
  int64_t cached_prompt_tokens() const { return cached_prompt_tokens_; }
  // What this sequence reuses from the prefix cache (locked until it retires).
  PrefixHit& prefix_hit() { return prefix_hit_; }

  std::vector<int32_t>& blocks() { return blocks_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // The sparse cache's working set when this sequence runs sparse, else null (dense blocks).
  const std::shared_ptr<WorkingSet>& sparse_kv() const { return sparse_kv_; }
  void set_sparse_kv(std::shared_ptr<WorkingSet> ws) { sparse_kv_ = std::move(ws); }
  // The most tokens this sequence can ever hold: prompt + max_tokens, capped by the model.
  int64_t max_total_tokens() const;

  // Consumes the token sampled from `logits` (masked first by the output constraint, if any),
  // updates stop state and fills `out`. An error (the constraint allows no token) accepts
  // nothing.
  absl::Status Accept(absl::Span<float> logits, SequenceOutput* out);
  // The same for a token sampled on the device (the engine's ModelRunner): whether this sequence
  // can be (no penalties: a grammar's mask is applied there too, Backend::MaskLogits), its
  // settings for the next step, and the result (an error as Accept's).
  bool CanSampleOnDevice() const { return !sampler_.has_penalties(); }
  RowSampling NextDeviceRow() { return sampler_.NextRow(); }
  // The constraint whose grammar holds for the next token (its mask can be prepared ahead), or
  // null.
  OutputConstraint* holding_constraint() {
    return constraint_ != nullptr && constraint_->active() ? constraint_.get() : nullptr;
  }
  absl::Status AcceptSampled(const SampledRow& row, SequenceOutput* out);
  // Ends the sequence for a reason decided outside (cancellation).
  void Finish(FinishReason reason, SequenceOutput* out);
  bool finished() const { return finish_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return finish_; }

 private:
  // Output tokens whose room is reserved at construction (64 KiB); a longer output grows it,
  // doubling.
  static constexpr int64_t kReservedOutputTokens = 16384;
  // Appends the sampled token and updates the stop state and `out`.
  void Take(SampledToken s, SequenceOutput* out);
  uint64_t id_;
  GenerationRequest request_;
  absl::flat_hash_set<int32_t> stop_ids_;  // eos (unless ignore_eos) and stop_token_ids
  int64_t max_context_;
  std::vector<int32_t> generated_;
  std::vector<int32_t> blocks_;
  std::shared_ptr<WorkingSet> sparse_kv_;
  int64_t prefilled_ = 0;
  int64_t kv_len_ = 0;
  int64_t prefill_target_ = 0;        // prompt size, or num_tokens() at the last preemption
  int64_t cached_prompt_tokens_ = 0;  // at admission (a resume's reuse is not the prompt's)
  bool preempted_ = false;            // waiting to be resumed: holds no KV
  int32_t preemptions_ = 0;
  PrefixHit prefix_hit_;
  Sampler sampler_;
  StreamingDetokenizer detok_;
  StopMatcher stops_;
  std::unique_ptr<OutputConstraint> constraint_;  // null without one
  FinishReason finish_ = FinishReason::kNone;
};

}  // namespace specula
