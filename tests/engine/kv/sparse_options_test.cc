// The sparse section's values: names round-trip, and every bad value names its key.
#include "engine/kv/sparse_options.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(SparseOptionsTest, NamesRoundTrip) {
  for (SpeculationMode m : {SpeculationMode::kNone, SpeculationMode::kCrossStep,
                            SpeculationMode::kCrossLayer, SpeculationMode::kBoth}) {
    EXPECT_EQ(ParseSpeculationMode(SpeculationModeName(m)).value(), m);
  }
  for (MissPolicy p : {MissPolicy::kAuto, MissPolicy::kDefer, MissPolicy::kFetch}) {
    EXPECT_EQ(ParseMissPolicy(MissPolicyName(p)).value(), p);
  }
  EXPECT_EQ(ParseSpeculationMode("cross-step").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMissPolicy("drop").status().code(), absl::StatusCode::kInvalidArgument);
  // The old, timing-dependent policy: refused, naming its replacement.
  EXPECT_THAT(ParseMissPolicy("skip").status().message(), ::testing::HasSubstr("'defer'"));
}

TEST(SparseOptionsTest, AutoDefersWhereTheHostStoreIsAcrossABus) {
  EXPECT_EQ(ResolveMissPolicy(MissPolicy::kAuto, /*backend_memory_is_host_memory=*/false),
            MissPolicy::kDefer);
  EXPECT_EQ(ResolveMissPolicy(MissPolicy::kAuto, true), MissPolicy::kFetch);
  for (bool host : {false, true}) {
    EXPECT_EQ(ResolveMissPolicy(MissPolicy::kDefer, host), MissPolicy::kDefer);
    EXPECT_EQ(ResolveMissPolicy(MissPolicy::kFetch, host), MissPolicy::kFetch);
  }
}

TEST(SparseOptionsTest, CorrectedPagesRoundUpTheShareOfTheBudget) {
  EXPECT_EQ(CorrectedPages(0.5, 8), 4);
  EXPECT_EQ(CorrectedPages(0.25, 9), 3);  // 2.25: a page more, never less than the share
  EXPECT_EQ(CorrectedPages(0.0, 8), 0);
  EXPECT_EQ(CorrectedPages(1.0, 8), 8);
  EXPECT_EQ(CorrectedPages(0.01, 1), 1);
  EXPECT_EQ(CorrectedPages(0.55, 100), 55);  // not 56: the product is a hair above 55 in doubles
}

TEST(SparseOptionsTest, DefaultsAreValidAndDerivedValuesFollowTheBudget) {
  SparseOptions o;
  EXPECT_TRUE(ValidateSparseOptions(o).ok());
  EXPECT_EQ(o.effective_min_context_tokens(), 2 * o.budget_tokens);
  EXPECT_EQ(o.effective_prefetch_extra_tokens(400), 200);  // half the request's budget
  o.min_context_tokens = 0;
  o.prefetch_extra_tokens = 0;
  EXPECT_EQ(o.effective_min_context_tokens(), 0);
  EXPECT_EQ(o.effective_prefetch_extra_tokens(400), 0);
}

TEST(SparseOptionsTest, BadValuesNameTheirKey) {
  struct Case {
    const char* key;
    void (*apply)(SparseOptions&);
  };
  const Case cases[] = {
      {"budget_tokens", [](SparseOptions& o) { o.budget_tokens = 0; }},
      {"budget_tokens", [](SparseOptions& o) { o.budget_tokens = int64_t{1} << 40; }},
      {"sink_tokens", [](SparseOptions& o) { o.sink_tokens = -1; }},
      {"recent_tokens", [](SparseOptions& o) { o.recent_tokens = -5; }},
      {"min_context_tokens", [](SparseOptions& o) { o.min_context_tokens = -2; }},
      {"prefetch_threads", [](SparseOptions& o) { o.prefetch_threads = 0; }},
      {"prefetch_threads", [](SparseOptions& o) { o.prefetch_threads = 65; }},
      {"prefetch_extra_tokens", [](SparseOptions& o) { o.prefetch_extra_tokens = -3; }},
      {"selector", [](SparseOptions& o) { o.selector = "lowrank"; }},
  };
  for (const Case& c : cases) {
    SparseOptions o;
    c.apply(o);
    const absl::Status s = ValidateSparseOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_NE(s.message().find(std::string("sparse.") + c.key), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace specula
