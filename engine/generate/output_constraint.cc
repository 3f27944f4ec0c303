#include "engine/generate/output_constraint.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace specula {

grammar::TokenTable GrammarTokenTable(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (size_t id = 0; id < bytes.size(); ++id) {
    const auto token = static_cast<TokenId>(id);
    if (!tokenizer.IsSpecial(token)) bytes[id] = tokenizer.TokenBytes(token);
  }
  return grammar::TokenTable(bytes);
}

std::shared_ptr<grammar::MaskCache> MaskCaches::For(
    const std::shared_ptr<const grammar::Grammar>& g) {
  absl::erase_if(slots_, [](const auto& slot) { return slot.second.grammar.expired(); });
  Slot& slot = slots_[g.get()];
  if (slot.cache == nullptr) slot = {g, std::make_shared<grammar::MaskCache>()};
  return slot.cache;
}

OutputConstraint::OutputConstraint(std::shared_ptr<const grammar::Grammar> grammar,
                                   grammar::TokenMasker& masker,
                                   std::shared_ptr<grammar::MaskCache> cache,
                                   const Tokenizer& tokenizer, absl::flat_hash_set<int32_t> end_ids)
    : matcher_(std::move(grammar)),
      masker_(masker),
      cache_(std::move(cache)),
      tokenizer_(tokenizer),
      end_ids_(std::move(end_ids)) {}

absl::Status OutputConstraint::Mask(absl::Span<float> logits) {
  int64_t allowed = masker_.Compute(matcher_, cache_.get(), &mask_);
  const bool can_end = matcher_.CanEnd();
  const auto n = static_cast<int64_t>(logits.size());
  // The end tokens' logits, kept: allowed exactly where the output can end, whatever the mask.
  ends_.clear();
  for (const int32_t e : end_ids_) {
    if (e < n) ends_.push_back({e, logits[e]});
  }
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  const auto table_size = static_cast<int64_t>(mask_.size()) * 32;
  for (int64_t word = 0; word * 32 < n; ++word) {
    const uint32_t bits = word * 32 < table_size ? mask_[static_cast<size_t>(word)] : 0;
    if (bits == ~uint32_t{0}) continue;  // all 32 allowed
    const int64_t end = std::min(n, word * 32 + 32);
    for (int64_t id = word * 32; id < end; ++id) {
      if (!((bits >> (id & 31)) & 1)) logits[id] = kRefused;
    }
  }
  for (const auto& [e, logit] : ends_) {
    const bool in_mask = e < table_size && grammar::MaskAllows(mask_, e);
    logits[e] = can_end ? logit : kRefused;
    allowed += (can_end && !in_mask) - (!can_end && in_mask);
  }
  if (allowed == 0) {
    return absl::FailedPreconditionError(
        "the output constraint allows no token here: the model's vocabulary cannot spell what "
        "the grammar needs next");
  }
  return absl::OkStatus();
}

absl::Status OutputConstraint::Accept(int32_t token) {
  if (end_ids_.contains(token)) return absl::OkStatus();
  if (!matcher_.Advance(tokenizer_.TokenBytes(token))) {
    return absl::InternalError("a token the output constraint refused was sampled");
  }
  return absl::OkStatus();
}

}  // namespace specula
