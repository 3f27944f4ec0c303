// The stateless row sampler: the order each draw walks (what makes the device exact against the
// host for a given uniform), what Sample reports, and that the per-sequence Sampler is this
// sampler plus its random stream and penalties.
#include "engine/sampling/row_sampling.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/sampling/sampler.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

std::vector<float> LogitsFromProbs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

RowSampling Stochastic(double uniform) {
  RowSampling row;
  row.temperature = 1.0f;
  row.uniform = uniform;
  return row;
}

RowSampling Greedy() { return RowSampling{}; }  // temperature 0

// Probabilities 0.1, 0.4, 0.2, 0.3: ranked, the tokens are 1, 3, 2, 0.
const std::vector<float> kFour = LogitsFromProbs({0.1, 0.4, 0.2, 0.3});

TEST(RowSamplerTest, UntruncatedDrawWalksTokensInIdOrder) {
  RowSampler sampler;
  // Cumulative in id order: 0.1, 0.5, 0.7, 1.0. Ranked, 0.55 would land on token 3 (0.4, 0.7).
  EXPECT_EQ(sampler.Choose(Stochastic(0.55), kFour), 2);
  EXPECT_EQ(sampler.Choose(Stochastic(0.05), kFour), 0);
  EXPECT_EQ(sampler.Choose(Stochastic(0.0), kFour), 0);
  EXPECT_EQ(sampler.Choose(Stochastic(0.999999), kFour), 3);
}

TEST(RowSamplerTest, TopKDrawWalksTheRankedPrefix) {
  RowSampler sampler;
  RowSampling row = Stochastic(0.5);
  row.top_k = 3;  // keeps 1, 3, 2 (0.9 in all): 0.5 of it is 0.45, past 0.4, within 0.7
  EXPECT_EQ(sampler.Choose(row, kFour), 3);
  row.uniform = 0.95;  // 0.855: past 0.7, the third ranked
  EXPECT_EQ(sampler.Choose(row, kFour), 2);
}

TEST(RowSamplerTest, NucleusDrawWalksTheRankedPrefix) {
  RowSampler sampler;
  RowSampling row = Stochastic(0.5);
  row.top_p = 0.85f;  // ranked 0.4, 0.7, 0.9 >= 0.85: keeps 1, 3, 2; in id order 0.45 is token 2
  EXPECT_EQ(sampler.Choose(row, kFour), 3);
  row.uniform = 0.3;  // 0.27 of 0.9: the first ranked
  EXPECT_EQ(sampler.Choose(row, kFour), 1);
  row.min_p = 0.6f;  // weights relative to 0.4: 1, 0.75, 0.5, 0.25: min-p ends it at token 3
  row.uniform = 0.99;
  EXPECT_EQ(sampler.Choose(row, kFour), 3);

  // Tokens 0 and 1 both lie well inside the nucleus: ranked, 1 comes first (0.3 of 0.9 is 0.27,
  // within its 0.4), where id order would give 0.
  row.min_p = 0.0f;
  row.uniform = 0.3;
  EXPECT_EQ(sampler.Choose(row, LogitsFromProbs({0.3, 0.4, 0.2, 0.1})), 1);
}

TEST(RowSamplerTest, NucleusOnEqualLogitsKeepsTheLowestIds) {
  RowSampler sampler;
  const std::vector<float> flat(1000, 0.25f);
  RowSampling row = Stochastic(0.999999);
  row.top_p = 0.0995f;  // 99.5 of 1000 weights: the 100 lowest ids, drawn in id order
  EXPECT_EQ(sampler.Choose(row, flat), 99);
  row.uniform = 0.5;
  EXPECT_EQ(sampler.Choose(row, flat), 50);
}

TEST(RowSamplerTest, SampleReportsTokenLogprobAndRankedAlternatives) {
  RowSampler sampler;
  RowSampling row;  // greedy
  row.logprobs = 3;
  const SampledRow out = sampler.Sample(row, kFour);
  EXPECT_EQ(out.status, RowSampleStatus::kOk);
  EXPECT_EQ(out.token, 1);
  EXPECT_NEAR(out.logprob, std::log(0.4), 1e-6);
  ASSERT_EQ(out.alternatives, 3);
  EXPECT_EQ(out.alternative_tokens[0], 1);
  EXPECT_EQ(out.alternative_tokens[1], 3);
  EXPECT_EQ(out.alternative_tokens[2], 2);
  EXPECT_NEAR(out.alternative_logprobs[2], std::log(0.2), 1e-6);

  row.logprobs = 20;  // more than the vocabulary: all four
  EXPECT_EQ(sampler.Sample(row, kFour).alternatives, 4);
  row.logprobs = -1;
  const SampledRow none = sampler.Sample(row, kFour);
  EXPECT_EQ(none.alternatives, 0);
  EXPECT_EQ(none.logprob, 0.0f);
}

TEST(RowSamplerTest, NonFiniteLogitsAreReportedNotSampled) {
  RowSampler sampler;
  for (float bad : {NAN, INFINITY}) {
    std::vector<float> logits = kFour;
    logits[2] = bad;
    const SampledRow out = sampler.Sample(Stochastic(0.5), logits);
    EXPECT_EQ(out.status, RowSampleStatus::kNonFinite) << bad;
    EXPECT_EQ(out.token, 0);
  }
  const std::vector<float> none(4, -INFINITY);  // no token left to give
  EXPECT_EQ(sampler.Sample(Stochastic(0.5), none).status, RowSampleStatus::kNonFinite);
  EXPECT_EQ(sampler.Sample(Greedy(), none).status, RowSampleStatus::kNonFinite);
}

// -inf is a token never chosen (what a grammar's mask writes over the tokens it refuses), not an
// error: the row samples among the others, whatever the uniform.
TEST(RowSamplerTest, MinusInfinityIsATokenNeverChosen) {
  RowSampler sampler;
  std::vector<float> logits = kFour;
  const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  logits[best] = -INFINITY;
  EXPECT_NE(sampler.Sample(Greedy(), logits).token, best);
  for (double u : {0.0, 0.3, 0.6, 0.999}) {
    RowSampling row = Stochastic(u);
    row.logprobs = 2;
    const SampledRow out = sampler.Sample(row, logits);
    EXPECT_EQ(out.status, RowSampleStatus::kOk) << u;
    EXPECT_NE(out.token, best) << u;
    EXPECT_TRUE(std::isfinite(out.logprob)) << u;
  }
}

// The Sampler without penalties is the row sampler fed by the sequence's stream: one 53-bit
// uniform from mt19937_64(seed) per stochastic step.
TEST(RowSamplerTest, SamplerIsTheRowSamplerWithItsSeededStream) {
  std::mt19937_64 logit_rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(3000);
  for (float& x : logits) x = normal(logit_rng);

  for (int variant = 0; variant < 5; ++variant) {
    SamplingParams p;
    p.seed = 77 + variant;
    p.logprobs = 2;
    p.temperature = variant == 0 ? 0.0f : 0.8f;
    if (variant == 2) p.top_k = 50;
    if (variant == 3) p.top_p = 0.7f;
    if (variant == 4) p.min_p = 0.05f;
    Sampler sampler(p, {});
    std::mt19937_64 stream(*p.seed);
    RowSampler rows;
    RowSampling row{p.temperature, p.top_k, p.top_p, p.min_p, p.logprobs};
    for (int step = 0; step < 50; ++step) {
      if (p.temperature > 0.0f) row.uniform = static_cast<double>(stream() >> 11) * 0x1.0p-53;
      std::vector<float> work = logits;
      const SampledToken got = sampler.Sample(absl::MakeSpan(work));
      const SampledRow want = rows.Sample(row, logits);
      ASSERT_EQ(got.token, want.token) << "variant " << variant << " step " << step;
      EXPECT_EQ(got.logprob, want.logprob);
      ASSERT_EQ(static_cast<int32_t>(got.top.size()), want.alternatives);
      for (int i = 0; i < want.alternatives; ++i) {
        EXPECT_EQ(got.top[i].token, want.alternative_tokens[i]);
      }
    }
  }
}

}  // namespace
}  // namespace specula
