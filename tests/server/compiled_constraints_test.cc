// CompiledConstraints: one grammar per distinct constraint (so requests share the engine's mask
// cache for it), bounded, and errors that name the schema's problem.
#include "server/compiled_constraints.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula {
namespace {

using ::specula::grammar::testing::Accepts;
using ::testing::HasSubstr;

v1::OutputConstraint Schema(const std::string& schema, bool strict) {
  v1::OutputConstraint c;
  c.set_json_schema(schema);
  c.set_strict(strict);
  return c;
}

TEST(CompiledConstraintsTest, TheSameConstraintGetsTheSameGrammar) {
  CompiledConstraints cache;
  const auto a = cache.Get(Schema(R"({"type": "integer"})", true));
  const auto b = cache.Get(Schema(R"({"type": "integer"})", true));
  const auto lax = cache.Get(Schema(R"({"type": "integer"})", false));
  ASSERT_TRUE(a.ok() && b.ok() && lax.ok());
  EXPECT_NE(*a, nullptr);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *lax);  // strict changes what an object schema allows
  v1::OutputConstraint object;
  object.set_json_object(true);
  EXPECT_EQ(*cache.Get(object), *cache.Get(object));
  EXPECT_EQ(*cache.Get(v1::OutputConstraint()), nullptr);  // unset: no constraint
  object.set_json_object(false);
  EXPECT_EQ(*cache.Get(object), nullptr);
}

TEST(CompiledConstraintsTest, KeepsTheMostRecentlyUsedUpToItsCapacity) {
  CompiledConstraints cache(/*capacity=*/2);
  const auto one = *cache.Get(Schema(R"({"const": 1})", false));
  const auto two = *cache.Get(Schema(R"({"const": 2})", false));
  EXPECT_EQ(*cache.Get(Schema(R"({"const": 1})", false)), one);  // now the most recent
  cache.Get(Schema(R"({"const": 3})", false)).IgnoreError();     // drops "2"
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(*cache.Get(Schema(R"({"const": 1})", false)), one);
  EXPECT_NE(*cache.Get(Schema(R"({"const": 2})", false)), two);  // compiled again
}

TEST(CompiledConstraintsTest, ErrorsNameTheProblemAndAreNotKept) {
  CompiledConstraints cache;
  for (int i = 0; i < 2; ++i) {
    const auto bad = cache.Get(Schema(R"({"type": "string", "not": {"const": "x"}})", true));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("keyword 'not' is supported with a type"));
  }
  EXPECT_THAT(cache.Get(Schema("{not json", true)).status().message(),
              HasSubstr("output_constraint.json_schema"));
  EXPECT_EQ(cache.size(), 0u);
}

v1::OutputConstraint Choice(std::vector<std::string> options) {
  v1::OutputConstraint c;
  c.mutable_choice();  // set, even with no options
  for (std::string& o : options) c.mutable_choice()->add_options(std::move(o));
  return c;
}

// A regex matches the whole output; a choice is exactly one option. Keys keep kinds and lists
// apart: ["ab", "c"] is not ["a", "bc"], a regex is not a schema of the same text.
TEST(CompiledConstraintsTest, RegexAndChoiceCompileToTheirOwnGrammars) {
  CompiledConstraints cache;
  v1::OutputConstraint regex;
  regex.set_regex("[a-c]+\\d");
  auto g = cache.Get(regex);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "abca7"));
  EXPECT_FALSE(Accepts(*g, "xabc7"));  // whole output, not a search
  EXPECT_FALSE(Accepts(*g, "abc"));
  auto yes_no = cache.Get(Choice({"yes", "no", "not sure"}));
  ASSERT_TRUE(yes_no.ok()) << yes_no.status();
  EXPECT_TRUE(Accepts(*yes_no, "not sure"));
  EXPECT_FALSE(Accepts(*yes_no, "not"));
  EXPECT_FALSE(Accepts(*yes_no, "yes "));
  const auto ab_c = *cache.Get(Choice({"ab", "c"}));
  const auto a_bc = *cache.Get(Choice({"a", "bc"}));
  EXPECT_NE(ab_c, a_bc);
  EXPECT_TRUE(Accepts(a_bc, "bc"));
  EXPECT_FALSE(Accepts(ab_c, "bc"));
  v1::OutputConstraint same_text;  // the text of a schema (true: any value), as a regex
  same_text.set_regex("true");
  const auto as_regex = *cache.Get(same_text);
  EXPECT_NE(as_regex, *cache.Get(Schema("true", false)));
  EXPECT_TRUE(Accepts(as_regex, "true"));
  EXPECT_FALSE(Accepts(as_regex, "1"));
}

// After a reasoning model's think block: a grammar of its own, which takes the block first.
TEST(CompiledConstraintsTest, AnAnswerLeadGetsItsOwnGrammar) {
  CompiledConstraints cache;
  const v1::OutputConstraint c = Choice({"yes", "no"});
  const auto plain = *cache.Get(c);
  const auto after_block = *cache.Get(c, grammar::AnswerLead::kOptionalReasoning);
  EXPECT_NE(plain, after_block);
  EXPECT_EQ(after_block, *cache.Get(c, grammar::AnswerLead::kOptionalReasoning));
  EXPECT_TRUE(Accepts(after_block, "<think>hmm</think>\n\nyes"));
  EXPECT_TRUE(Accepts(after_block, "no"));
  EXPECT_FALSE(Accepts(plain, "<think>hmm</think>\n\nyes"));
  EXPECT_TRUE(Accepts(*cache.Get(c, grammar::AnswerLead::kInReasoning), "hmm</think>no"));
  // The line breaks after the block are not content: an answer that may begin with one is
  // refused after a block, and fine without.
  const v1::OutputConstraint starts_with_break = Choice({"\nyes", "no"});
  EXPECT_TRUE(cache.Get(starts_with_break).ok());
  const auto refused = cache.Get(starts_with_break, grammar::AnswerLead::kOptionalReasoning);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("may begin with a line break"));
}

TEST(CompiledConstraintsTest, AnEbnfGrammarHoldsTheOutput) {
  CompiledConstraints cache;
  v1::OutputConstraint c;
  c.set_grammar("root ::= item (\", \" item)*\nitem ::= [a-z]+");
  auto g = cache.Get(c);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "ab, c"));
  EXPECT_FALSE(Accepts(*g, "ab,c"));
  c.set_grammar("root ::= missing");
  EXPECT_THAT(cache.Get(c).status().message(),
              HasSubstr("output_constraint: ebnf at line 1 column 10: rule 'missing'"));
}

TEST(CompiledConstraintsTest, RegexAndChoiceErrorsNameTheProblem) {
  CompiledConstraints cache;
  v1::OutputConstraint regex;
  regex.set_regex("(a)\\1");
  EXPECT_THAT(cache.Get(regex).status().message(),
              HasSubstr("output_constraint: regex at offset 3: backreferences (\\1 ...) are not "
                        "supported"));
  EXPECT_EQ(cache.Get(Choice({})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cache.Get(Choice({})).status().message(), HasSubstr("at least one option"));
}

}  // namespace
}  // namespace specula
