// CompiledConstraints: one grammar per distinct constraint (so requests share the engine's mask
// cache for it), bounded, and errors that name the schema's problem.
#include "server/compiled_constraints.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

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
  cache.Get(Schema(R"({"const": 3})", false)).IgnoreError();    // drops "2"
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(*cache.Get(Schema(R"({"const": 1})", false)), one);
  EXPECT_NE(*cache.Get(Schema(R"({"const": 2})", false)), two);  // compiled again
}

TEST(CompiledConstraintsTest, ErrorsNameTheProblemAndAreNotKept) {
  CompiledConstraints cache;
  for (int i = 0; i < 2; ++i) {
    const auto bad = cache.Get(Schema(R"({"type": "string", "pattern": "a+"})", true));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("keyword 'pattern' is not supported"));
  }
  EXPECT_THAT(cache.Get(Schema("{not json", true)).status().message(),
              HasSubstr("output_constraint.json_schema"));
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace specula
