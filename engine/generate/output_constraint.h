// A request's output constraint while it decodes (docs/STRUCTURED_OUTPUT.md): each step's logits
// are masked to the tokens the grammar allows next, the request's end tokens only where the
// output can end, and the sampled token is followed through the grammar. A row with a constraint
// samples on the host (the mask is computed there; a device mask is future work).
//
// Engine thread only: the masker's scratch is the Generator's.
#pragma once

#include <cstdint>
#include <memory>
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
// are classified once while it stays in use. A cache goes with its grammar.
class MaskCaches {
 public:
  std::shared_ptr<grammar::MaskCache> For(const std::shared_ptr<const grammar::Grammar>& g);
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    std::weak_ptr<const grammar::Grammar> grammar;
    std::shared_ptr<grammar::MaskCache> cache;
  };
  absl::flat_hash_map<const grammar::Grammar*, Slot> slots_;
};

class OutputConstraint {
 public:
  OutputConstraint(std::shared_ptr<const grammar::Grammar> grammar, grammar::TokenMasker& masker,
                   std::shared_ptr<grammar::MaskCache> cache, const Tokenizer& tokenizer,
                   absl::flat_hash_set<int32_t> end_ids);

  // Sets every refused token's logit to -infinity. FAILED_PRECONDITION when none is left: the
  // vocabulary cannot spell what the grammar needs next.
  absl::Status Mask(absl::Span<float> logits);
  // Follows a token the mask allowed (an end token takes nothing). INTERNAL if the grammar
  // refuses it, which the mask rules out.
  absl::Status Accept(int32_t token);
  // The output is complete and nothing may follow: the request ends here.
  bool complete() const { return matcher_.IsComplete(); }

 private:
  grammar::GrammarMatcher matcher_;
  grammar::TokenMasker& masker_;
  std::shared_ptr<grammar::MaskCache> cache_;
  const Tokenizer& tokenizer_;
  absl::flat_hash_set<int32_t> end_ids_;
  std::vector<uint32_t> mask_;
  std::vector<std::pair<int32_t, float>> ends_;  // Mask's scratch: the end tokens' logits
};

}  // namespace specula
