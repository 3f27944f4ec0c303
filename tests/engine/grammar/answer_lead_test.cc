// A reasoning model's think block before a constrained answer (engine/grammar/answer_lead.h).
#include "engine/grammar/answer_lead.h"

#include <memory>
#include <string>

#include "engine/grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;
using B = GrammarBuilder;

// `lead` before the answer "{}".
std::shared_ptr<const Grammar> LeadThenBraces(AnswerLead lead) {
  B b;
  const int32_t answer = b.AddRule("answer", {B::Literal("{}")});
  auto g = b.Build(AddAnswerLead(b, lead, answer));
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const Grammar>(*std::move(g));
}

TEST(AnswerLeadTest, AnOptionalBlockThenTheAnswer) {
  const auto g = LeadThenBraces(AnswerLead::kOptionalReasoning);
  EXPECT_TRUE(Accepts(g, "{}"));
  EXPECT_TRUE(Accepts(g, "<think>\nweather?</think>\n\n{}"));
  EXPECT_TRUE(Accepts(g, "<think></think>{}"));
  // Near misses of the close tag are reasoning text; '<' restarts the match.
  EXPECT_TRUE(Accepts(g, "<think>a<b </thin> <</think>{}"));
  EXPECT_TRUE(Accepts(g, "<think>{}</think>{}"));
  EXPECT_FALSE(Accepts(g, "<think>x{}"));                // the block never closed
  EXPECT_FALSE(Accepts(g, "<think>x</think>"));          // no answer
  EXPECT_FALSE(Accepts(g, "<think>x</think>ok {}"));     // text between block and answer
  EXPECT_FALSE(Accepts(g, "<think>x</think>\n\n\n{}"));  // at most 2 line breaks
  EXPECT_FALSE(Accepts(g, "<think>x</think> {}"));       // what the reasoning split keeps
  EXPECT_FALSE(Accepts(g, "x{}"));
}

TEST(AnswerLeadTest, InsideTheBlockThePromptOpened) {
  const auto g = LeadThenBraces(AnswerLead::kInReasoning);
  EXPECT_TRUE(Accepts(g, "thinking</think>\n{}"));
  EXPECT_TRUE(Accepts(g, "</think>{}"));
  EXPECT_FALSE(Accepts(g, "{}"));  // the block must close first
  EXPECT_TRUE(Accepts(LeadThenBraces(AnswerLead::kNone), "{}"));
  EXPECT_FALSE(Accepts(LeadThenBraces(AnswerLead::kNone), "<think></think>{}"));
}

// However long the reasoning, the parse stacks stay flat: each byte is a tail call.
TEST(AnswerLeadTest, LongReasoningKeepsStacksFlat) {
  GrammarMatcher m(LeadThenBraces(AnswerLead::kOptionalReasoning));
  ASSERT_TRUE(m.Advance("<think>"));
  const std::string chunk = "a long line of thought < with / tags </thin and more\n";
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(m.Advance(chunk)) << i;
  for (size_t i = 0; i < m.stacks().size(); ++i) {
    EXPECT_LE(m.stacks().end(i) - m.stacks().begin(i), 4);
  }
  ASSERT_TRUE(m.Advance("</think>\n\n{}"));
  EXPECT_TRUE(m.IsComplete());
}

}  // namespace
}  // namespace specula::grammar
