// ECMAScript regular expressions (the dialect JSON Schema's `pattern` uses) parsed into a tree
// of the regular operations: what engine/grammar/regex.h turns into grammar rules.
//
// Supported: literals (any UTF-8 text), `.`, classes `[a-z]` `[^...]` with ranges, the escapes
// \d \D \w \W \s \S \t \n \v \f \r \0 \cX \xHH \uHHHH (surrogate pairs joined) \u{H...} and any
// escaped punctuation, groups `( )` `(?: )` `(?<name> )`, alternation `|`, the quantifiers
// * + ? {n} {n,} {n,m} (lazy forms too: they match the same strings), and ^ / $ at the start / end
// of a top-level alternative. Refused with INVALID_ARGUMENT naming the construct: backreferences,
// lookahead and lookbehind, \b and \B, Unicode property escapes, ^ or $ anywhere else, and
// repetition bounds over `max_repeat`. The language does not depend on flags: none are taken.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/code_points.h"

namespace specula::grammar {

struct RegexNode {
  enum class Kind : uint8_t {
    kEmpty,   // the empty string
    kChars,   // one code point of `chars`
    kConcat,  // `children` one after another
    kUnion,   // one of `children`
    kRepeat,  // children[0], between `min` and `max` times (max < 0: no bound)
    kRef,     // grammar rule `rule` (EBNF grammars only)
  };
  Kind kind = Kind::kEmpty;
  CodePointSet chars;
  std::vector<RegexNode> children;
  int64_t min = 0;
  int64_t max = -1;
  int32_t rule = -1;
};

// One top-level alternative of a pattern and whether ^ / $ anchor it.
struct RegexBranch {
  RegexNode node;
  bool anchored_start = false;
  bool anchored_end = false;
};

struct RegexLimits {
  int64_t max_repeat = 1000;  // the largest {n,m} bound
  int max_depth = 64;         // nested groups and quantifiers
  size_t max_length = 4096;   // bytes of pattern
};

// The pattern's top-level alternatives. INVALID_ARGUMENT naming what is malformed or unsupported
// (with its byte offset).
absl::StatusOr<std::vector<RegexBranch>> ParseRegex(std::string_view pattern,
                                                    const RegexLimits& limits = {});

// The (min, max) of the quantifier * (0, -1), + (1, -1) or ? (0, 1); nullopt for another
// character.
std::optional<std::pair<int64_t, int64_t>> SimpleQuantifier(char c);

// One code point of `set`; `child` between `min` and `max` times.
RegexNode CharsNode(CodePointSet set);
RegexNode RepeatNode(RegexNode child, int64_t min, int64_t max);

// Whether `node` matches the empty string (a rule reference is taken as not).
bool Nullable(const RegexNode& node);

}  // namespace specula::grammar
