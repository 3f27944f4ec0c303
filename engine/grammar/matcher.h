// Runs a Grammar over bytes as they are generated: which bytes may come next, whether the output
// so far is a complete sentence.
//
// The state is the set of parse stacks a pushdown automaton could be in (several when the grammar
// is ambiguous at this point, e.g. optional whitespace). A stack lists grammar positions, the
// innermost rule's on top; every stack's top is a byte symbol, or the stack is empty (the root
// rule is complete). A byte advances each stack whose top takes it, then expands the new tops:
// a rule reference opens one stack per alternative, an alternative's end returns to the rule
// that referred to it. Grammars are free of left recursion (GrammarBuilder::Build), so the
// expansion ends.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/grammar/grammar.h"

namespace specula::grammar {

// A set of parse stacks, stored flat so that copying one reuses its memory.
class StackSet {
 public:
  // More stacks than this at once: the grammar is too ambiguous to follow, and the stacks past
  // it are dropped. Dropping a stack only takes continuations away (what the remaining stacks
  // allow, the grammar allows), so an overflow can narrow the output, never make it invalid;
  // Step reports it.
  static constexpr size_t kMaxStacks = 1024;

  size_t size() const { return offsets_.size() - 1; }
  bool empty() const { return size() == 0; }
  void Clear();
  // No tag: what every stack carries but in RepeatWatch's walks.
  static constexpr uint16_t kNoTag = 0xFFFF;

  // Adds `stack` with `tag` unless one with equal frames is there, untagged if `tag` is none,
  // tagged otherwise (then it keeps the lesser tag). False when the set is full.
  bool Add(absl::Span<const int32_t> stack, uint16_t tag = kNoTag);
  uint16_t tag(size_t i) const { return tags_[i]; }
  const int32_t* begin(size_t i) const { return frames_.data() + offsets_[i]; }
  const int32_t* end(size_t i) const { return frames_.data() + offsets_[i + 1]; }

 private:
  std::vector<int32_t> frames_;
  std::vector<uint32_t> offsets_{0};
  std::vector<uint64_t> hashes_;  // of each stack: most comparisons end there
  std::vector<uint16_t> tags_;
};

// Followed by a walk that starts inside a bounded repetition (Grammar::counted), at its body
// reference at `depth` of the start stack with count `anchor`, so that one walk can tell what
// every smaller count allows. A stack that ends the repetition (pops that frame) is tagged with
// its need: the least count at which the repetition could have ended there. Stacks still inside
// stay untagged; their need follows from the count at `depth` (NeedInside).
struct RepeatWatch {
  size_t depth = 0;
  int32_t anchor = 0;
  // Out, per Step: the least need of the stacks that escaped (RepeatWatch::kNone: none did).
  uint16_t escape_need = kNone;
  static constexpr uint16_t kNone = StackSet::kNoTag;

  // The need of a stack that ends the repetition at `pos`, the end of tail_k's empty
  // alternative: the repetition had k counts to spare.
  uint16_t NeedOnLeaving(const Grammar& g, int32_t pos) const;
  // The need of a stack still inside, whose frame at `depth` is `pos`, tail_k's body reference:
  // the counts it went down, plus one for the body it is in.
  uint16_t NeedInside(const Grammar& g, int32_t pos) const;
};

// `in` after one more byte; empty when no stack takes it. False when `out` overflowed.
// With `escaped`, the stacks of `in` are the top frames of longer stacks (TokenMasker's cache
// keys): a stack that would end is not added, and *escaped is set instead. With `next` >= 0, the
// byte after this one is known (a token's): only the stacks that take it are kept. With `watch`,
// stacks leaving its repetition are tagged (RepeatWatch).
bool Step(const Grammar& g, const StackSet& in, uint8_t byte, StackSet* out,
          bool* escaped = nullptr, int next = -1, RepeatWatch* watch = nullptr);
// Whether some stack of `s` is empty: the bytes so far are a complete sentence.
bool CanEnd(const StackSet& s);

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Takes `bytes` if the grammar allows all of them next; otherwise changes nothing and returns
  // false. Where the grammar is too ambiguous to follow (more than StackSet::kMaxStacks parses),
  // the first stacks are kept: what may follow narrows.
  bool Advance(std::string_view bytes);
  // The bytes so far form a complete sentence.
  bool CanEnd() const { return grammar::CanEnd(stacks_); }
  // Complete, and no byte may follow.
  bool IsComplete() const;
  // Whether `byte` may come next.
  bool Allows(uint8_t byte) const;

  const Grammar& grammar() const { return *grammar_; }
  const StackSet& stacks() const { return stacks_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  StackSet stacks_;
  StackSet next_;
};

}  // namespace specula::grammar
