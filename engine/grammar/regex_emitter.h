// Regular-expression trees (engine/grammar/regex_syntax.h) written as grammar rules: for regexes
// (engine/grammar/regex.h) and EBNF grammars (engine/grammar/ebnf.h), whose trees also refer to
// rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/regex_syntax.h"

namespace specula::grammar {

// Repetition of something that can match the empty string is rewritten (a repeated empty match
// would make the grammar left-recursive): X* = (X minus "")*. A rule reference counts as not
// empty: if the rule can be, GrammarBuilder::Build refuses the repetition as left-recursive.
// The trees must outlive the emitter (rules are kept per node).
class RegexEmitter {
 public:
  RegexEmitter(GrammarBuilder& b, RegexText text) : b_(b), text_(text) {}

  // A rule deriving exactly `n`'s texts.
  int32_t RuleFor(const RegexNode& n);
  // `n`'s symbols appended to `out`.
  void Append(const RegexNode& n, Alternative& out);
  // Any text at all (the unanchored ends of a search).
  int32_t AnyText();
  // What the rules made from now on are named after (errors name them): "regex" at first, an
  // EBNF grammar's rule while its definition is written.
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string Name(absl::string_view suffix) const { return absl::StrCat(name_, suffix); }
  std::optional<ByteSet> SingleBytes(const CodePointSet& chars) const;
  int32_t CharsRule(const CodePointSet& chars);
  int32_t RepeatRule(const RegexNode& x, int64_t min, int64_t max);
  // A rule deriving `n`'s texts but the empty one; nullopt when that is its only text.
  std::optional<int32_t> NonEmptyRule(const RegexNode& n);
  std::optional<int32_t> MakeNonEmptyRule(const RegexNode& n);

  GrammarBuilder& b_;
  const RegexText text_;
  absl::flat_hash_map<const RegexNode*, int32_t> rules_;
  absl::flat_hash_map<std::vector<std::pair<uint32_t, uint32_t>>, int32_t> char_rules_;
  std::optional<int32_t> any_text_;
  absl::flat_hash_map<const RegexNode*, std::optional<int32_t>> non_empty_;
  std::string name_ = "regex";
};

}  // namespace specula::grammar
