#include "engine/generate/output_constraint.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/common/check.h"
#include "engine/common/fault_injection.h"
#include "engine/common/status_macros.h"
#include "engine/sampling/row_sampling.h"

namespace specula {

grammar::TokenTable GrammarTokenTable(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (size_t id = 0; id < bytes.size(); ++id) {
    const auto token = static_cast<TokenId>(id);
    if (!tokenizer.IsSpecial(token)) bytes[id] = tokenizer.TokenBytes(token);
  }
  return grammar::TokenTable(bytes);
}

void MaskCaches::EraseExpired() {
  absl::erase_if(slots_, [](const auto& slot) { return slot.second.grammar.expired(); });
}

std::shared_ptr<grammar::MaskCache> MaskCaches::For(
    const std::shared_ptr<const grammar::Grammar>& g) {
  std::lock_guard lock(mu_);
  EraseExpired();
  Slot& slot = slots_[g.get()];
  slot.grammar = g;
  if (slot.cache == nullptr) slot.cache = std::make_shared<grammar::MaskCache>();
  return slot.cache;
}

bool MaskCaches::StartPreparing(const std::shared_ptr<const grammar::Grammar>& g) {
  std::lock_guard lock(mu_);
  EraseExpired();
  const auto [it, added] = slots_.try_emplace(g.get());
  if (!added) return false;
  it->second.grammar = g;
  it->second.preparing = true;
  return true;
}

void MaskCaches::FinishPreparing(const grammar::Grammar* g,
                                 std::shared_ptr<grammar::MaskCache> prepared) {
  std::lock_guard lock(mu_);
  const auto it = slots_.find(g);
  CHECK(it != slots_.end() && it->second.preparing);
  it->second.preparing = false;
  if (it->second.cache != nullptr) return;  // a request started meanwhile: its cache stays
  it->second.prepared_costly_walks = prepared->costly_walks();
  it->second.cache = std::move(prepared);
}

int64_t MaskCaches::CostlyWalksInSteps() const {
  std::lock_guard lock(mu_);
  int64_t walks = 0;
  for (const auto& [g, slot] : slots_) {
    if (slot.cache != nullptr && !slot.grammar.expired()) {
      walks += slot.cache->costly_walks() - slot.prepared_costly_walks;
    }
  }
  return walks;
}

bool MaskCaches::Preparing(const grammar::Grammar* g) const {
  std::lock_guard lock(mu_);
  const auto it = slots_.find(g);
  // A request that started meanwhile (For) has the grammar's cache: the preparation's is dropped,
  // so nothing waits for it.
  return it != slots_.end() && it->second.preparing && it->second.cache == nullptr;
}

size_t MaskCaches::size() const {
  std::lock_guard lock(mu_);
  return slots_.size();
}

OutputConstraint::OutputConstraint(ConstraintSpec spec, grammar::TokenMasker& masker,
                                   MaskCaches& caches, const Tokenizer& tokenizer,
                                   absl::flat_hash_set<int32_t> end_ids)
    : spec_(std::move(spec)),
      caches_(caches),
      masker_(masker),
      tokenizer_(tokenizer),
      end_ids_(std::move(end_ids)) {
  CHECK(!spec_.empty());
  CHECK(spec_.triggered == nullptr || !spec_.trigger.empty());
  if (spec_.grammar != nullptr) {
    Activate(spec_.grammar);
    initial_ = true;
  }
}

void OutputConstraint::Activate(const std::shared_ptr<const grammar::Grammar>& g) {
  matcher_.emplace(g);
  cache_ = caches_.For(g);
  prepared_ = false;
}

void OutputConstraint::PrepareMask(grammar::TokenMasker& masker) {
  if (!active()) return;
  allowed_ = masker.Compute(*matcher_, cache_.get(), &mask_);
  prepared_ = true;
}

absl::Status OutputConstraint::FinishMask(int64_t vocab) {
  if (!prepared_) PrepareMask(masker_);
  prepared_ = false;  // one use: the sampled token moves the matcher
  // Ids past the tokenizer's table (a padded vocabulary) are never allowed.
  mask_.resize(std::max(mask_.size(), static_cast<size_t>((vocab + 31) / 32)), 0);
  int64_t allowed = allowed_;
  const bool can_end = matcher_->CanEnd();
  // The end tokens: allowed exactly where the output can end, whatever the grammar's mask says.
  for (const int32_t e : end_ids_) {
    if (e >= vocab) continue;
    uint32_t& word = mask_[static_cast<size_t>(e) / 32];
    const uint32_t bit = uint32_t{1} << (e & 31);
    const bool in_mask = (word & bit) != 0;
    word = can_end ? (word | bit) : (word & ~bit);
    allowed += (can_end && !in_mask) - (!can_end && in_mask);
  }
  if (allowed == 0 || SPECULA_FAULT(Fault::kEmptyMask)) {
    // The request was valid; the model and vocabulary failed it: a server-side error.
    return absl::InternalError(
        "the output constraint allows no token here: the model's vocabulary cannot spell what "
        "the grammar needs next");
  }
  return absl::OkStatus();
}

absl::Status OutputConstraint::Mask(absl::Span<float> logits) {
  if (!active()) return absl::OkStatus();
  RETURN_IF_ERROR(FinishMask(static_cast<int64_t>(logits.size())));
  MaskRow(logits, mask_.data());
  return absl::OkStatus();
}

absl::Status OutputConstraint::WriteMask(absl::Span<uint32_t> words, int64_t vocab) {
  CHECK(active());
  CHECK_EQ(static_cast<int64_t>(words.size()), (vocab + 31) / 32);
  RETURN_IF_ERROR(FinishMask(vocab));
  std::copy_n(mask_.begin(), words.size(), words.begin());
  return absl::OkStatus();
}

bool OutputConstraint::Advance(std::string_view bytes) {
  if (!matcher_->Advance(bytes)) return false;
  if (matcher_->IsComplete()) {
    // The output ends here: the grammar stays, allowing the end tokens only.
    if (initial_ && spec_.ends_output) {
      complete_ = true;
      return true;
    }
    matcher_.reset();
    cache_.reset();
    initial_ = false;
  }
  return true;
}

absl::Status OutputConstraint::Watch(std::string_view bytes) {
  if (spec_.triggered == nullptr) return absl::OkStatus();
  std::string text = tail_;
  text += bytes;
  const size_t at = text.find(spec_.trigger);
  if (at == std::string::npos) {
    const size_t keep = std::min(text.size(), spec_.trigger.size() - 1);
    tail_ = text.substr(text.size() - keep);
    return absl::OkStatus();
  }
  tail_.clear();
  Activate(spec_.triggered);
  const std::string_view rest = std::string_view(text).substr(at + spec_.trigger.size());
  if (!rest.empty() && !Advance(rest)) {
    return absl::InternalError(
        "the model opened a tool call and began it in one token that the tool's strict schema "
        "refuses");
  }
  // The trigger again inside the same token: a nested opening is left to the grammar, which
  // refuses it.
  return absl::OkStatus();
}

absl::Status OutputConstraint::Accept(int32_t token) {
  prepared_ = false;
  if (end_ids_.contains(token)) return absl::OkStatus();
  const std::string bytes = tokenizer_.TokenBytes(token);
  if (!active()) return Watch(bytes);
  if (!Advance(bytes)) {
    return absl::InternalError("a token the output constraint refused was sampled");
  }
  return absl::OkStatus();
}

}  // namespace specula
