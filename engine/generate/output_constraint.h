// A request's output constraint while it decodes (docs/STRUCTURED_OUTPUT.md): each step's logits
// are masked to the tokens the grammar allows next, the request's end tokens only where the
// output can end, and the sampled token is followed through the grammar. A grammar holds from the
// first token (a response format, a forced tool call) or from each time the output writes a
// trigger (a strict tool call the model opens). The mask reaches the logits as bits on the
// device (WriteMask, Backend::MaskLogits), or on the host when the step samples there (Mask).
//
// Engine thread only, but for PrepareMask: the engine's MaskWorker prepares a step's masks on its
// own thread while the step's forward pass runs, and hands the constraints back before sampling.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"
#include "engine/tokenizer/tokenizer.h"

namespace specula {

// The grammar's view of a tokenizer's vocabulary: each token's bytes, none for special tokens
// (their text is never output, so no grammar can ask for them).
grammar::TokenTable GrammarTokenTable(const Tokenizer& tokenizer);

// The mask caches of the grammars in use, one per grammar: requests that share a compiled
// grammar (the server compiles each distinct schema once) share its cache, so a schema's masks
// are classified once while it stays in use. A cache goes with its grammar. A grammar's cache may
// be prepared before its first request (MaskPreparer), and For then gives that one.
//
// Thread-safe. A cache For gave belongs to the engine thread (its steps' masks); one being
// prepared belongs to the preparer until FinishPreparing.
class MaskCaches {
 public:
  // The cache of `g`: its own, the prepared one, or a new one (also while `g` is being prepared:
  // the one prepared is then dropped, its costly walks kept among the shared entries).
  std::shared_ptr<grammar::MaskCache> For(const std::shared_ptr<const grammar::Grammar>& g);
  // Claims `g` for preparing: false if it has a cache already or is being prepared.
  bool StartPreparing(const std::shared_ptr<const grammar::Grammar>& g);
  void FinishPreparing(const grammar::Grammar* g, std::shared_ptr<grammar::MaskCache> prepared);
  // Whether a request of `g` should wait: it is being prepared and no request has its cache yet.
  bool Preparing(const grammar::Grammar* g) const;
  size_t size() const;
  // Costly walks (grammar::MaskCache::costly_walks) of the live grammars' caches since they were
  // handed over: what steps waited for that preparation did not build. Call while no step runs.
  int64_t CostlyWalksInSteps() const;

 private:
  struct Slot {
    std::weak_ptr<const grammar::Grammar> grammar;
    std::shared_ptr<grammar::MaskCache> cache;  // null while being prepared
    bool preparing = false;
    int64_t prepared_costly_walks = 0;  // the cache's when it was handed over
  };
  void EraseExpired();  // mu_ held

  mutable std::mutex mu_;
  absl::flat_hash_map<const grammar::Grammar*, Slot> slots_;
};

// What a request's output must follow.
struct ConstraintSpec {
  // Holds from the first token; null: the output starts free.
  std::shared_ptr<const grammar::Grammar> grammar;
  // Whether the output ends once `grammar` is complete (a response format). Otherwise free text
  // follows it (a forced tool call: the model closes the call and may go on).
  bool ends_output = true;
  // While the output is free: each time its text ends with `trigger` (a tool call's opening tag),
  // `triggered` holds until it is complete, and then the output is free again.
  std::string trigger;
  std::shared_ptr<const grammar::Grammar> triggered;

  bool empty() const { return grammar == nullptr && triggered == nullptr; }
};

class OutputConstraint {
 public:
  // `spec` is not empty; with `triggered`, `trigger` is not empty.
  OutputConstraint(ConstraintSpec spec, grammar::TokenMasker& masker, MaskCaches& caches,
                   const Tokenizer& tokenizer, absl::flat_hash_set<int32_t> end_ids);

  // Whether a grammar holds for the next token (else the output is free and Mask changes
  // nothing).
  bool active() const { return matcher_.has_value(); }
  // Computes the next token's mask with `masker` ahead of Mask: on any thread, while nothing else
  // touches this constraint, `masker` or the grammar's mask cache. Nothing while no grammar holds.
  void PrepareMask(grammar::TokenMasker& masker);
  // Sets every refused token's logit to -infinity (MaskRow: NaN and +inf stay), with the
  // prepared mask or else one computed now. INTERNAL when none is left: the vocabulary cannot spell
  // what the grammar needs next (the request was valid; the model failed it).
  absl::Status Mask(absl::Span<float> logits);
  // The same mask as bits for Backend::MaskLogits (bit t % 32 of word t / 32 set where token t
  // is allowed; `words` holds ceil(vocab / 32)), for a row sampled where its logits are. Only
  // while a grammar holds; the same INTERNAL as Mask.
  absl::Status WriteMask(absl::Span<uint32_t> words, int64_t vocab);
  // Follows a token the mask allowed (an end token takes nothing), or a free token (watching for
  // the trigger). INTERNAL if the grammar refuses a token the mask allowed, or if the token that
  // completed the trigger went on with text the triggered grammar refuses (the model wrote the
  // tag and the call's start as one token, so the mask could not hold it).
  absl::Status Accept(int32_t token);
  // The output is complete and nothing may follow: the request ends here.
  bool complete() const { return complete_; }

 private:
  void Activate(const std::shared_ptr<const grammar::Grammar>& g);
  // Takes the prepared mask (computing it now if none is) over `vocab` tokens, with the end
  // tokens' bits set exactly where the output can end; INTERNAL when it allows nothing.
  absl::Status FinishMask(int64_t vocab);
  // Follows `bytes` through the active grammar; free again once it is complete (or the end).
  bool Advance(std::string_view bytes);
  // Watches free text for the trigger; activates the triggered grammar after it.
  absl::Status Watch(std::string_view bytes);

  const ConstraintSpec spec_;
  MaskCaches& caches_;
  std::optional<grammar::GrammarMatcher> matcher_;  // the grammar holding now
  bool initial_ = false;                            // the one holding is spec_.grammar
  bool complete_ = false;
  std::string tail_;  // the end of the free text, shorter than the trigger
  grammar::TokenMasker& masker_;
  std::shared_ptr<grammar::MaskCache> cache_;
  const Tokenizer& tokenizer_;
  absl::flat_hash_set<int32_t> end_ids_;
  std::vector<uint32_t> mask_;
  bool prepared_ = false;  // mask_ is the next token's (the matcher has not moved since)
  int64_t allowed_ = 0;    // tokens in mask_
};

}  // namespace specula
