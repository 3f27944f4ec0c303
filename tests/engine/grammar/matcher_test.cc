// GrammarMatcher: bytes in, whether the output so far can end, and refusals that change nothing.
#include "engine/grammar/matcher.h"

#include "gtest/gtest.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;

// greeting ::= "hi" ( " " name )? ; name ::= [a-z]+
std::shared_ptr<const Grammar> Greeting() {
  B b;
  const int32_t letter = b.AddRule("letter", {{B::Bytes(ByteSet::Range('a', 'z'))}});
  const int32_t name = b.Repeat("name", letter, 1, -1);
  const int32_t tail = b.AddRule("tail", {{B::Bytes(ByteSet::Of(" ")), B::Ref(name)}, {}});
  Alternative root = B::Literal("hi");
  root.push_back(B::Ref(tail));
  auto g = b.Build(b.AddRule("greeting", {root}));
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const Grammar>(*std::move(g));
}

TEST(GrammarMatcherTest, FollowsBytesAndKnowsWhereTheOutputCanEnd) {
  GrammarMatcher m(Greeting());
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Allows('h'));
  EXPECT_FALSE(m.Allows('x'));
  ASSERT_TRUE(m.Advance("hi"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.IsComplete());  // a name may follow
  ASSERT_TRUE(m.Advance(" "));
  EXPECT_FALSE(m.CanEnd());  // the space needs a name
  ASSERT_TRUE(m.Advance("bob"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.Allows('z'));
  EXPECT_FALSE(m.Allows(' '));
}

TEST(GrammarMatcherTest, ARefusedAdvanceChangesNothing) {
  GrammarMatcher m(Greeting());
  ASSERT_TRUE(m.Advance("hi "));
  EXPECT_FALSE(m.Advance("bo!"));  // the first two bytes fit, the last does not
  EXPECT_FALSE(m.CanEnd());        // still right after "hi ": "bo" was not taken
  EXPECT_TRUE(m.Advance("bob"));
  EXPECT_TRUE(m.CanEnd());
}

TEST(GrammarMatcherTest, ACompleteSentenceTakesNothingMore) {
  B b;
  auto g = b.Build(b.AddRule("ok", {B::Literal("ok")}));
  ASSERT_TRUE(g.ok());
  GrammarMatcher m(std::make_shared<const Grammar>(*std::move(g)));
  ASSERT_TRUE(m.Advance("ok"));
  EXPECT_TRUE(m.IsComplete());
  EXPECT_FALSE(m.Advance(" "));
}

}  // namespace
}  // namespace specula::grammar
