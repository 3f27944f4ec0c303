// EBNF grammars (engine/grammar/ebnf.h): recursion, the GBNF dialect's syntax, agreement with the
// regex compiler on regular languages, and errors that say where.
#include "engine/grammar/ebnf.h"

#include <string>
#include <vector>

#include "engine/grammar/regex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;
using ::specula::grammar::testing::AllStrings;
using ::testing::HasSubstr;

TEST(EbnfTest, RecursiveRulesNestAsDeepAsTheTextDoes) {
  auto g = CompileEbnf(R"e(
    # arithmetic, written across lines as GBNF files are
    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::=
      factor (("*" | "/") factor)*
    factor ::= [0-9]+ | "(" expr ")"
  )e");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "1+2*(3-4)"));
  EXPECT_TRUE(Accepts(*g, "((((7))))/12"));
  EXPECT_FALSE(Accepts(*g, "1+"));
  EXPECT_FALSE(Accepts(*g, "(1"));
  EXPECT_FALSE(Accepts(*g, "1++2"));
  EXPECT_FALSE(Accepts(*g, ""));
}

TEST(EbnfTest, StringsClassesEscapesAndBounds) {
  auto g = CompileEbnf(
      "root ::= \"\\x41\\u00e9\\\"\" [^a-c\\]] . \"\" [\\-x]{2,3} ws\n"
      "ws ::= [ \\t\\n]?\n");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "A\xC3\xA9\"d\xF0\x9F\x98\x80-x"));
  EXPECT_FALSE(Accepts(*g, "A\xC3\xA9\"]Zxx"));  // ] is escaped into the negated class
  EXPECT_TRUE(Accepts(*g, "A\xC3\xA9\"dZxxx\n"));
  EXPECT_FALSE(Accepts(*g, "A\xC3\xA9\"bZxx"));  // b is in a-c
  EXPECT_FALSE(Accepts(*g, "A\xC3\xA9\"dZ-"));   // one of {2,3}
  EXPECT_FALSE(Accepts(*g, "A\xC3\xA9\"dZ----"));
}

// On regular languages, a grammar and the equivalent regex accept the same strings.
TEST(EbnfTest, AgreesWithTheEquivalentRegex) {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {R"e(root ::= ("a" | "b")* "abb")e", "(a|b)*abb"},
      {R"e(root ::= x{1,3} "c"?
          x ::= "a" "b"?)e",
       "(ab?){1,3}c?"},
      {R"e(root ::= ("a"? "b"?)* "c")e", "(a?b?)*c"},
      {R"e(root ::= [ab]+ | "" )e", "[ab]+|"},
      {R"e(root ::= ( "ab" | "a" ) ( "bc" | "c" ))e", "(ab|a)(bc|c)"},
  };
  const std::vector<std::string> texts = AllStrings("abc", 5);
  for (const auto& [ebnf, regex] : pairs) {
    SCOPED_TRACE(ebnf);
    auto g = CompileEbnf(ebnf);
    ASSERT_TRUE(g.ok()) << g.status();
    auto r = CompileRegex(regex);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const std::string& t : texts) ASSERT_EQ(Accepts(*g, t), Accepts(*r, t)) << t;
  }
}

TEST(EbnfTest, ErrorsSayWhatAndWhere) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"root ::= a\nb ::= \"x\"", "line 1 column 10: rule 'a' is used but not defined"},
      {"root ::= \"a\"\nroot ::= \"b\"", "line 2 column 6: rule 'root' is defined twice"},
      {"start ::= \"a\"", "no rule is named root"},
      {"", "the grammar has no rules"},
      {"root ::= \"a", "unterminated string"},
      {"root ::= [a", "missing ]"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= (\"a\"", "missing )"},
      {"root ::= \"a\")", "unmatched )"},
      {"root = \"a\"", "expected ::= after 'root'"},
      {"root ::= \"a\"{3,1}", "m > n"},
      {"root ::= \"a\"{10001}", "bound over 10000"},
      {"root ::= \"a\"**", "a quantifier after a quantifier"},
      {"root ::= \"\\q\"", "unknown escape \\q"},
      {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
      {"root ::= [^\\x00-\\U0010FFFF]", "no character satisfies"},
      {"root ::= " + std::string(70, '(') + "\"a\"" + std::string(70, ')'), "deeper than 64"},
      {"root ::= root \"a\" | \"a\"", "left-recursive"},
      {"root ::= x* \nx ::= \"a\"?", "rule 'root_repeat_more' is left-recursive"},
      {"root ::= \"a\" root", "no output can satisfy"},
  };
  // A chain of rules deeper than the matcher may expand before a byte: refused, not a crash.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 5000; ++i) {
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  }
  chain += "r5000 ::= \"a\"\n";
  EXPECT_THAT(CompileEbnf(chain).status().message(), HasSubstr("may nest more than 2048 rules"));
  for (const auto& [text, message] : cases) {
    auto g = CompileEbnf(text);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(g.status().message(), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace specula::grammar
