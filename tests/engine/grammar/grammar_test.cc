// GrammarBuilder: what Build refuses (each would make the matcher loop, stall or accept nothing)
// and the bounds of Repeat.
#include "engine/grammar/grammar.h"

#include "engine/grammar/matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;

using ::testing::HasSubstr;
using B = GrammarBuilder;

TEST(GrammarBuilderTest, RefusesLeftRecursionDirectAndThroughNullableRules) {
  {
    B b;
    const int32_t r = b.NewRule("list");
    b.AddAlternative(r, {B::Ref(r), B::Bytes(ByteSet::Of("a"))});
    b.AddAlternative(r, B::Literal("a"));
    EXPECT_THAT(b.Build(r).status().message(), HasSubstr("left-recursive"));
  }
  {
    B b;
    const int32_t empty = b.AddRule("maybe", {{}, B::Literal("x")});
    const int32_t r = b.NewRule("loop");
    b.AddAlternative(r, {B::Ref(empty), B::Ref(r), B::Bytes(ByteSet::Of("a"))});
    b.AddAlternative(r, B::Literal("a"));
    EXPECT_THAT(b.Build(r).status().message(), HasSubstr("left-recursive"));
  }
}

TEST(GrammarBuilderTest, RefusesARootNoStringSatisfiesAndEmptyRules) {
  {
    B b;
    const int32_t r = b.NewRule("forever");
    b.AddAlternative(r, {B::Bytes(ByteSet::Of("a")), B::Ref(r)});  // never ends
    EXPECT_THAT(b.Build(r).status().message(), HasSubstr("no output can satisfy"));
  }
  {
    B b;
    const int32_t r = b.NewRule("nothing");
    EXPECT_THAT(b.Build(r).status().message(), HasSubstr("is empty"));
  }
}

TEST(GrammarBuilderTest, RefusesGrammarsOverTheSymbolBudget) {
  B b(/*max_symbols=*/100);
  const int32_t a = b.AddRule("a", {B::Literal("a")});
  const int32_t r = b.Repeat("many", a, 0, 1000);
  EXPECT_THAT(b.Build(r).status().message(), HasSubstr("more than 100 symbols"));
}

TEST(GrammarBuilderTest, RepeatTakesBetweenMinAndMax) {
  B b;
  const int32_t a = b.AddRule("a", {B::Literal("a")});
  auto g = b.Build(b.Repeat("two_to_four", a, 2, 4));
  ASSERT_TRUE(g.ok()) << g.status();
  auto grammar = std::make_shared<const Grammar>(*std::move(g));
  EXPECT_FALSE(Accepts(grammar, "a"));
  EXPECT_TRUE(Accepts(grammar, "aa"));
  EXPECT_TRUE(Accepts(grammar, "aaaa"));
  EXPECT_FALSE(Accepts(grammar, "aaaaa"));
  B unbounded;
  const int32_t x = unbounded.AddRule("x", {B::Literal("x")});
  auto u = unbounded.Build(unbounded.Repeat("some", x, 1, -1));
  ASSERT_TRUE(u.ok());
  auto ug = std::make_shared<const Grammar>(*std::move(u));
  EXPECT_FALSE(Accepts(ug, ""));
  EXPECT_TRUE(Accepts(ug, std::string(500, 'x')));
}

// Repeated alternatives (`a||b`, `(x|x)*`) are one: each copy would be one more parse stack at
// every step.
TEST(GrammarBuilderTest, RepeatedAlternativesAreDropped) {
  B b;
  const int32_t x = b.AddRule("x", {B::Literal("ab"), B::Literal("ab"), {}, {}, B::Literal("c")});
  auto g = b.Build(x);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rules()[x].alternatives.size(), 3u);
  auto shared = std::make_shared<const Grammar>(*std::move(g));
  EXPECT_TRUE(Accepts(shared, "ab"));
  EXPECT_TRUE(Accepts(shared, ""));
  EXPECT_TRUE(Accepts(shared, "c"));
  GrammarMatcher m(shared);
  ASSERT_TRUE(m.Advance("a"));
  EXPECT_EQ(m.stacks().size(), 1u);
}

}  // namespace
}  // namespace specula::grammar
