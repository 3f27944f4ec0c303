// GrammarBuilder: what Build refuses (each would make the matcher loop, stall or accept nothing)
// and the bounds of Repeat.
#include "engine/grammar/grammar.h"

#include <algorithm>
#include <vector>

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

// The token masker derives a bounded repetition's counts from one (TokenMasker): the grammar
// says which positions are its body references and its ends, with their counts, and only where
// each repetition takes a byte.
TEST(GrammarBuilderTest, BoundedRepetitionsRecordTheirCounts) {
  B b;
  const int32_t x = b.AddRule("x", {B::Literal("x")});
  const int32_t maybe = b.AddRule("maybe", {B::Literal("y"), {}});
  const int32_t root =
      b.AddRule("root", {{B::Ref(b.Repeat("xs", x, 1, 4)), B::Ref(b.Repeat("ys", maybe, 0, 3))}});
  auto g = b.Build(root);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<int32_t> body_counts, end_counts;
  for (int32_t pos = 0; pos < g->num_positions(); ++pos) {
    const CountedPosition at = g->counted(pos);
    if (at.repeat < 0) continue;
    EXPECT_EQ(at.repeat, 0);  // "ys" may repeat an empty body: no counts
    (g->kind(pos) == PositionKind::kRule ? body_counts : end_counts).push_back(at.count);
  }
  std::sort(body_counts.begin(), body_counts.end());
  std::sort(end_counts.begin(), end_counts.end());
  EXPECT_EQ(body_counts, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(end_counts, (std::vector<int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(g->repeat_max(0), 3);
  for (int32_t k = 1; k <= 3; ++k) EXPECT_EQ(g->counted(g->body_ref(0, k)).count, k);
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
