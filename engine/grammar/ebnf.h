// Context-free grammars written in EBNF (the GBNF dialect of llama.cpp, which vLLM, SGLang and
// XGrammar also take) compiled to a Grammar: the `grammar` output constraint.
//
// The dialect (docs/STRUCTURED_OUTPUT.md):
//   root   ::= "yes" | "no" | number      # a comment runs to the end of the line
//   number ::= "-"? [0-9]+ ("." [0-9]{1,6})?
// A grammar is rules `name ::= alternatives`; names are [A-Za-z_][A-Za-z0-9_-]*, and `root` is
// where the text starts. An alternative is a sequence of items: a string "..." (escapes \n \r \t
// \\ \" \' \xHH \uHHHH \UHHHHHHHH), a class [a-z] or [^...] (the same escapes, and \] \[ \-),
// `.` (any character), a rule's name, or a group ( ... ); each may be followed by * + ? {m}
// {m,} or {m,n}. Whitespace, line breaks included, separates items anywhere; a rule ends where
// the next `name ::=` starts. Text is UTF-8; classes and `.` take code points.
//
// INVALID_ARGUMENT (with line and column) for a syntax error, a rule defined twice, a name used
// but not defined, no root, a bound over 10,000, nesting deeper than 64; GrammarBuilder::Build's
// refusals (left recursion, a root no text satisfies, over the symbol budget) name the rule.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace specula::grammar {

// Adds `text`'s rules to `b`; returns its root rule.
absl::StatusOr<int32_t> AddEbnf(std::string_view text, GrammarBuilder& b);

absl::StatusOr<std::shared_ptr<const Grammar>> CompileEbnf(std::string_view text,
                                                           int64_t max_symbols = 1 << 20);

}  // namespace specula::grammar
