// A context-free grammar over bytes: what every output constraint (a JSON Schema, "any JSON
// object", ...) compiles to, and what GrammarMatcher runs while a request decodes.
//
// A rule is a choice among alternatives; an alternative is a sequence of symbols, each a set of
// bytes or a reference to a rule. Repetition is recursion to the right (GrammarBuilder's helpers
// write it), so every grammar Build accepts is free of left recursion, which is what lets the
// matcher expand a rule without looping.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specula::grammar {

// A set of byte values.
class ByteSet {
 public:
  static ByteSet Range(uint8_t lo, uint8_t hi);
  static ByteSet Of(std::string_view bytes);
  bool Contains(uint8_t b) const { return (words_[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t lo, uint8_t hi);
  ByteSet& operator|=(const ByteSet& other);
  bool empty() const { return (words_[0] | words_[1] | words_[2] | words_[3]) == 0; }
  const std::array<uint64_t, 4>& words() const { return words_; }

 private:
  std::array<uint64_t, 4> words_{};
};

struct Symbol {
  int32_t rule = -1;  // >= 0: a reference to that rule; else `bytes`, one byte of the set
  ByteSet bytes;
};
using Alternative = std::vector<Symbol>;

struct Rule {
  std::string name;  // for errors and debugging
  std::vector<Alternative> alternatives;
};

// Where a grammar position points: a symbol of an alternative, or the end of one.
enum class PositionKind : uint8_t { kBytes, kRule, kEnd };

// Where a position stands in the optional part of a bounded repetition, which
// GrammarBuilder::Repeat writes as a chain of rules tail_k ::= body tail_{k-1} | "" (k = M..1),
// tail_0 ::= "". Stacks at different k differ only in that count, and the token masker's cache
// uses it to derive the entries of every k from one (TokenMasker).
struct CountedPosition {
  int32_t repeat = -1;  // which repetition; -1: the position is in none
  int32_t count = 0;    // k
};

// A grammar, validated and flattened for the matcher: every alternative's symbols sit at
// consecutive positions followed by an end position, so "the next symbol" is position + 1.
class Grammar {
 public:
  const std::vector<Rule>& rules() const { return rules_; }
  int32_t root() const { return root_; }
  int64_t num_positions() const { return static_cast<int64_t>(kind_.size()); }

  PositionKind kind(int32_t pos) const { return kind_[pos]; }
  const ByteSet& bytes(int32_t pos) const { return bytes_[pos]; }
  int32_t referenced_rule(int32_t pos) const { return ref_[pos]; }
  // The first position of each of `rule`'s alternatives.
  const std::vector<int32_t>& alternative_starts(int32_t rule) const { return starts_[rule]; }

  // For tail_k's reference to its body ("inside a body, k - 1 more may follow") and for the end
  // of tail_k's empty alternative ("the repetition ends with k more allowed"): {repeat, k}.
  // Repeat -1 for every other position, and for repetitions whose body can be empty.
  CountedPosition counted(int32_t pos) const {
    return counted_.empty() ? CountedPosition{} : counted_[pos];
  }
  // M of a repetition, and the position of tail_k's reference to its body (k in 1..M).
  int32_t repeat_max(int32_t repeat) const {
    return static_cast<int32_t>(body_refs_[repeat].size());
  }
  int32_t body_ref(int32_t repeat, int32_t k) const { return body_refs_[repeat][k - 1]; }

 private:
  friend class GrammarBuilder;
  std::vector<Rule> rules_;
  int32_t root_ = 0;
  std::vector<PositionKind> kind_;
  std::vector<ByteSet> bytes_;
  std::vector<int32_t> ref_;
  std::vector<std::vector<int32_t>> starts_;
  std::vector<CountedPosition> counted_;  // by position; empty without bounded repetitions
  std::vector<std::vector<int32_t>> body_refs_;
};

// Writes a grammar rule by rule. Sizes are bounded (`max_symbols`): a schema that would compile
// to more is refused rather than left to stall whoever runs it.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(int64_t max_symbols = 1 << 20) : max_symbols_(max_symbols) {}

  // A new rule with no alternatives yet (so that rules can refer to each other).
  int32_t NewRule(std::string name);
  void AddAlternative(int32_t rule, Alternative alternative);
  // A rule with these alternatives.
  int32_t AddRule(std::string name, std::vector<Alternative> alternatives);

  static Symbol Ref(int32_t rule) { return Symbol{rule, {}}; }
  static Symbol Bytes(ByteSet set) { return Symbol{-1, set}; }
  // The exact bytes of `text`, one symbol each.
  static Alternative Literal(std::string_view text);

  // Rules for `body` repeated: at least `min` and at most `max` times (max < 0: no bound).
  // The bounded tail nests optionals, one rule per optional repetition.
  int32_t Repeat(std::string name, int32_t body, int64_t min, int64_t max);

  // Validates and flattens: every referenced rule exists and has an alternative, the root can
  // derive some string, no rule is left-recursive (directly or through rules that can be
  // empty), and the size is under the budget. INVALID_ARGUMENT naming the rule otherwise.
  absl::StatusOr<Grammar> Build(int32_t root);

  int64_t symbols() const { return symbols_; }
  // INVALID_ARGUMENT once the rules written so far pass the budget: compilers check it as they
  // go, so a schema that would blow it up is refused before it takes the memory.
  absl::Status CheckBudget() const;
  const std::string& rule_name(int32_t rule) const { return rules_[rule].name; }

 private:
  // The rules of a bounded repetition's optional part: tails[k] is tail_k.
  struct BoundedRepeat {
    int32_t body;
    std::vector<int32_t> tails;
  };
  // Records in `g` the repetitions whose rules kept Repeat's shape through Build's clean-up and
  // whose body cannot be empty (one repetition takes at least a byte).
  void RecordBoundedRepeats(const std::vector<bool>& nullable, Grammar& g) const;
  std::vector<Rule> rules_;
  std::vector<BoundedRepeat> repeats_;
  int64_t symbols_ = 0;
  int64_t max_symbols_;
};

}  // namespace specula::grammar
