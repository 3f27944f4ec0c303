#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::Pointwise;

std::vector<float> LogitsFromProbs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

SamplingParams Seeded(uint64_t seed = 42) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

// Draws `n` tokens from fresh copies of `logits` with one sampler; returns counts per token.
std::vector<int> Histogram(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p, {});
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> work;
  for (int i = 0; i < n; ++i) {
    work = logits;
    ++counts[s.Sample(absl::MakeSpan(work)).token];
  }
  return counts;
}

// Checks a binomial count against its expectation within 5 standard deviations.
void ExpectCountNear(int count, int n, double p) {
  const double mean = n * p;
  const double sigma = std::sqrt(n * p * (1.0 - p));
  EXPECT_NEAR(count, mean, 5.0 * sigma + 1e-9) << "p=" << p;
}

std::vector<float> RandomLogits(size_t vocab, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(vocab);
  for (float& x : v) x = dist(rng);
  return v;
}

// Ranks tokens most likely first (ties: lower id first).
std::vector<int32_t> RankTokens(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

TEST(SamplerTest, GreedyPicksArgmaxIgnoringTruncation) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 1;
  p.top_p = 0.01f;
  p.min_p = 1.0f;
  Sampler s(p, {});
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.9f};
  EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 1);
  std::vector<float> ties = {1.0f, 5.0f, -2.0f, 5.0f};
  EXPECT_EQ(s.Sample(absl::MakeSpan(ties)).token, 1);

  std::vector<float> big = RandomLogits(151936, 7, 4.0f);
  const int32_t expected =
      static_cast<int32_t>(std::max_element(big.begin(), big.end()) - big.begin());
  EXPECT_EQ(s.Sample(absl::MakeSpan(big)).token, expected);
}

TEST(SamplerTest, TemperatureOneMatchesDistribution) {
  const std::vector<double> probs = {0.2, 0.3, 0.5};
  const int n = 20000;
  std::vector<int> counts = Histogram(Seeded(), LogitsFromProbs(probs), n);
  for (size_t i = 0; i < probs.size(); ++i) ExpectCountNear(counts[i], n, probs[i]);
}

TEST(SamplerTest, TemperatureReshapesDistribution) {
  const std::vector<double> probs = {0.2, 0.3, 0.5};
  const int n = 20000;
  for (float t : {0.5f, 2.0f}) {
    SamplingParams p = Seeded(7);
    p.temperature = t;
    std::vector<int> counts = Histogram(p, LogitsFromProbs(probs), n);
    std::vector<double> expected;
    for (double q : probs) expected.push_back(std::pow(q, 1.0 / t));
    const double z = std::accumulate(expected.begin(), expected.end(), 0.0);
    for (size_t i = 0; i < probs.size(); ++i) ExpectCountNear(counts[i], n, expected[i] / z);
  }
}

TEST(SamplerTest, TopKKeepsOnlyKMostLikelyAndRenormalizes) {
  SamplingParams p = Seeded();
  p.top_k = 2;
  const int n = 20000;
  std::vector<int> counts = Histogram(p, LogitsFromProbs({0.1, 0.4, 0.2, 0.3}), n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  ExpectCountNear(counts[1], n, 0.4 / 0.7);
  ExpectCountNear(counts[3], n, 0.3 / 0.7);
}

TEST(SamplerTest, TopKBreaksTiesByLowerId) {
  SamplingParams p = Seeded();
  p.top_k = 2;
  std::vector<int> counts = Histogram(p, {0.0f, 1.0f, 1.0f, 1.0f}, 2000);
  EXPECT_THAT(counts, ElementsAre(0, testing::Gt(0), testing::Gt(0), 0));
  p.top_k = 1;
  counts = Histogram(p, {0.0f, 1.0f, 1.0f, 1.0f}, 200);
  EXPECT_THAT(counts, ElementsAre(0, 200, 0, 0));
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  const std::vector<float> logits = LogitsFromProbs({0.15, 0.5, 0.05, 0.3});
  const int n = 20000;
  SamplingParams p = Seeded();
  p.top_p = 0.75f;  // 0.5 + 0.3 = 0.8 >= 0.75
  std::vector<int> counts = Histogram(p, logits, n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  ExpectCountNear(counts[1], n, 0.5 / 0.8);

  p.top_p = 0.9f;  // needs 0.5 + 0.3 + 0.15
  counts = Histogram(p, logits, n);
  EXPECT_EQ(counts[2], 0);
  ExpectCountNear(counts[0], n, 0.15 / 0.95);

  p.top_p = 0.01f;  // the most likely token alone exceeds it: never an empty set
  counts = Histogram(p, logits, 500);
  EXPECT_THAT(counts, ElementsAre(0, 500, 0, 0));
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfMax) {
  const std::vector<float> logits = LogitsFromProbs({0.15, 0.5, 0.05, 0.3});
  const int n = 20000;
  SamplingParams p = Seeded();
  p.min_p = 0.5f;  // threshold 0.25: keeps 0.5 and 0.3
  std::vector<int> counts = Histogram(p, logits, n);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  ExpectCountNear(counts[3], n, 0.3 / 0.8);

  p.min_p = 1.0f;  // only the maximum (and exact ties with it) survive
  counts = Histogram(p, logits, 500);
  EXPECT_THAT(counts, ElementsAre(0, 500, 0, 0));
  counts = Histogram(p, {2.0f, 0.0f, 2.0f}, 2000);
  EXPECT_THAT(counts, ElementsAre(testing::Gt(0), 0, testing::Gt(0)));
}

TEST(SamplerTest, TopPAndMinPTogetherKeepTheSmallerSet) {
  const std::vector<float> logits = LogitsFromProbs({0.15, 0.5, 0.05, 0.3});
  SamplingParams p = Seeded();
  p.top_p = 0.9f;  // alone: {1, 3, 0}
  p.min_p = 0.4f;  // alone: {1, 3}
  std::vector<int> counts = Histogram(p, logits, 5000);
  EXPECT_THAT(counts, ElementsAre(0, testing::Gt(0), 0, testing::Gt(0)));
  p.top_p = 0.75f;  // alone: {1, 3}
  p.min_p = 0.2f;   // alone: {1, 3, 0}
  counts = Histogram(p, logits, 5000);
  EXPECT_THAT(counts, ElementsAre(0, testing::Gt(0), 0, testing::Gt(0)));
  p.top_k = 3;  // the sorted top-k path applies both cuts as well
  counts = Histogram(p, logits, 5000);
  EXPECT_THAT(counts, ElementsAre(0, testing::Gt(0), 0, testing::Gt(0)));
}

TEST(SamplerTest, CombinedTruncationOnLargeVocabStaysInAllowedSet) {
  const std::vector<float> logits = RandomLogits(152064, 3, 3.0f);
  const std::vector<int32_t> ranked = RankTokens(logits);
  SamplingParams p = Seeded(11);
  p.top_k = 50;
  p.top_p = 0.9f;
  p.temperature = 0.8f;
  // Reference nucleus within the top 50, in double precision.
  std::vector<double> w;
  for (int i = 0; i < 50; ++i) w.push_back(std::exp((logits[ranked[i]] - logits[ranked[0]]) / 0.8));
  const double z = std::accumulate(w.begin(), w.end(), 0.0);
  size_t keep = 0;
  for (double cum = 0.0; keep < w.size() && cum < 0.9 * z; ++keep) cum += w[keep];
  ASSERT_GT(keep, 1u);
  ASSERT_LT(keep, 50u);
  const std::set<int32_t> allowed(ranked.begin(), ranked.begin() + keep);

  Sampler s(p, {});
  std::set<int32_t> seen;
  std::vector<float> work;
  for (int i = 0; i < 800; ++i) {
    work = logits;
    const int32_t t = s.Sample(absl::MakeSpan(work)).token;
    ASSERT_TRUE(allowed.count(t)) << "token " << t << " outside the nucleus of " << keep;
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 1u);
}

TEST(SamplerTest, TopPWithoutTopKOnFlatLargeVocab) {
  // A flat distribution makes the nucleus a large part of the vocabulary, so the nucleus search
  // bisects many times before sorting its last block.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(131072);
  for (float& x : logits) x = dist(rng);
  const std::vector<int32_t> ranked = RankTokens(logits);
  std::vector<int32_t> rank_of(logits.size());
  for (size_t r = 0; r < ranked.size(); ++r) rank_of[ranked[r]] = static_cast<int32_t>(r);
  double z = 0.0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  size_t keep = 0;
  for (double cum = 0.0; cum < 0.5 * z; ++keep) {
    cum += std::exp(static_cast<double>(logits[ranked[keep]]));
  }

  SamplingParams p = Seeded(13);
  p.top_p = 0.5f;
  Sampler s(p, {});
  std::vector<float> work;
  int32_t max_rank = 0;
  for (int i = 0; i < 600; ++i) {
    work = logits;
    max_rank = std::max(max_rank, rank_of[s.Sample(absl::MakeSpan(work)).token]);
  }
  // One token of slack for float-vs-double rounding at the boundary.
  EXPECT_LE(static_cast<size_t>(max_rank), keep);
  // Draws spread over the nucleus rather than collapsing onto its head.
  EXPECT_GT(static_cast<size_t>(max_rank), keep * 9 / 10);
}

TEST(SamplerTest, TopPOnEqualLogitsKeepsLowestIds) {
  // Every token ties, so the nucleus is decided purely by the lower-id tie break: with 0.25 of
  // 100000 equally likely tokens (exact in binary), exactly ids [0, 25000) are kept.
  const std::vector<float> logits(100000, 0.5f);
  SamplingParams p = Seeded(17);
  p.top_p = 0.25f;
  Sampler s(p, {});
  std::vector<float> work;
  int32_t max_token = 0;
  for (int i = 0; i < 300; ++i) {
    work = logits;
    max_token = std::max(max_token, s.Sample(absl::MakeSpan(work)).token);
  }
  EXPECT_LT(max_token, 25000);
  EXPECT_GT(max_token, 20000);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 2, 2};
  Sampler s(p, prompt);
  std::vector<float> logits = {2.0f, 1.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 3);
  EXPECT_THAT(logits, Pointwise(FloatEq(), std::vector<float>{1.0f, 1.0f, -2.0f, 3.0f}));
  // Token 3 is now generated: penalized too, but each token only once.
  logits = {2.0f, 1.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 3);
  EXPECT_THAT(logits, Pointwise(FloatEq(), std::vector<float>{1.0f, 1.0f, -2.0f, 1.5f}));
}

TEST(SamplerTest, RepetitionPenaltyAppliesOnceForPromptAndOutput) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {1};
  Sampler s(p, prompt);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> logits = {0.0f, 8.0f};
    EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 1);
    EXPECT_FLOAT_EQ(logits[1], 4.0f) << "step " << step;
  }
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesUseGeneratedCounts) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {1};  // the prompt does not count for these penalties
  Sampler s(p, prompt);
  const std::vector<float> expected_0 = {5.0f, 5.0f - 0.75f, 5.0f - 1.25f, 5.0f - 1.75f};
  for (float want : expected_0) {
    std::vector<float> logits = {5.0f, 1.0f, -1.0f};
    EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 0);
    EXPECT_FLOAT_EQ(logits[0], want);
    EXPECT_FLOAT_EQ(logits[1], 1.0f);
    EXPECT_FLOAT_EQ(logits[2], -1.0f);
  }
}

TEST(SamplerTest, NegativePresencePenaltyRaisesLogits) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = -1.0f;
  Sampler s(p, {});
  std::vector<float> logits = {1.0f, 0.5f};
  EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 0);
  logits = {1.0f, 0.5f};
  s.Sample(absl::MakeSpan(logits));
  EXPECT_FLOAT_EQ(logits[0], 2.0f);
}

TEST(SamplerTest, RepetitionPenaltyComesBeforeFrequencyPenalty) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 1.0f;
  Sampler s(p, {});
  std::vector<float> logits = {4.0f, 0.0f};
  ASSERT_EQ(s.Sample(absl::MakeSpan(logits)).token, 0);
  logits = {4.0f, 0.0f};
  s.Sample(absl::MakeSpan(logits));
  EXPECT_FLOAT_EQ(logits[0], 4.0f / 2.0f - 1.0f);  // not (4 - 1) / 2
}

TEST(SamplerTest, PenaltyChangesSampledChoice) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.1f;
  const std::vector<int32_t> prompt = {0};
  Sampler s(p, prompt);
  std::vector<float> logits = {2.0f, 1.9f};  // 2 / 1.1 = 1.82 < 1.9
  EXPECT_EQ(s.Sample(absl::MakeSpan(logits)).token, 1);
}

std::vector<int32_t> Generate(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p, {});
  std::vector<int32_t> out;
  std::vector<float> work;
  for (int i = 0; i < n; ++i) {
    work = logits;
    out.push_back(s.Sample(absl::MakeSpan(work)).token);
  }
  return out;
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  const std::vector<float> logits = RandomLogits(1000, 9, 1.0f);
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p = Seeded(1234);
    if (variant == 1) p.top_k = 40;
    if (variant == 2) p.top_p = 0.7f;
    const std::vector<int32_t> a = Generate(p, logits, 200);
    EXPECT_EQ(a, Generate(p, logits, 200)) << "variant " << variant;
    p.seed = 1235;
    EXPECT_NE(a, Generate(p, logits, 200)) << "variant " << variant;
  }
  SamplingParams unseeded;
  EXPECT_NE(Generate(unseeded, logits, 200), Generate(unseeded, logits, 200));
}

TEST(SamplerTest, SeededOutputIsPinned) {
  // mt19937_64 and the 53-bit uniform conversion are fully specified, so these tokens must be the
  // same on every standard library; a change here changes users' seeded outputs.
  const std::vector<float> logits = LogitsFromProbs({0.1, 0.2, 0.3, 0.4});
  EXPECT_THAT(Generate(Seeded(2024), logits, 12), ElementsAre(3, 3, 1, 2, 0, 1, 3, 2, 1, 2, 2, 3));
}

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double m = -INFINITY;
  for (float x : logits) m = std::max<double>(m, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - m);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - m - std::log(sum));
  return out;
}

TEST(SamplerTest, LogprobsMatchLogSoftmaxOfRawLogits) {
  std::vector<float> logits = RandomLogits(5000, 21, 2.0f);
  for (float& x : logits) x += 1000.0f;  // a naive exp would overflow
  logits[17] = logits[42] = 1010.0f;     // tied maxima: lower id first
  const std::vector<double> ref = LogSoftmax(logits);
  const std::vector<int32_t> ranked = RankTokens(logits);

  SamplingParams p = Seeded();
  p.logprobs = 5;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;  // must not affect reported logprobs
  p.presence_penalty = 1.0f;
  Sampler s(p, std::vector<int32_t>{17, 42, 3});
  for (int step = 0; step < 5; ++step) {
    std::vector<float> work = logits;
    SampledToken t = s.Sample(absl::MakeSpan(work));
    ASSERT_TRUE(std::isfinite(t.logprob));
    EXPECT_NEAR(t.logprob, ref[t.token], 1e-4) << "step " << step;
    ASSERT_EQ(t.top.size(), 5u);
    for (size_t i = 0; i < t.top.size(); ++i) {
      EXPECT_EQ(t.top[i].token, ranked[i]);
      EXPECT_NEAR(t.top[i].logprob, ref[ranked[i]], 1e-4);
      if (i > 0) {
        EXPECT_GE(t.top[i - 1].logprob, t.top[i].logprob);
      }
    }
    EXPECT_EQ(t.top[0].token, 17);
    EXPECT_EQ(t.top[1].token, 42);
  }
}

TEST(SamplerTest, LogprobsZeroAndNone) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 0;
  Sampler with(p, {});
  std::vector<float> work = logits;
  SampledToken t = with.Sample(absl::MakeSpan(work));
  EXPECT_EQ(t.token, 2);
  EXPECT_TRUE(t.top.empty());
  EXPECT_NEAR(t.logprob, LogSoftmax(logits)[2], 1e-6);

  p.logprobs = -1;
  Sampler without(p, {});
  work = logits;
  t = without.Sample(absl::MakeSpan(work));
  EXPECT_TRUE(t.top.empty());
  EXPECT_EQ(t.logprob, 0.0f);
}

TEST(SamplerTest, MaskedLogitsAreNeverSampled) {
  const float ninf = -INFINITY;
  SamplingParams p = Seeded();
  p.top_p = 0.99f;
  std::vector<int> counts = Histogram(p, {ninf, 0.0f, ninf, 0.0f}, 1000);
  EXPECT_EQ(counts[0] + counts[2], 0);
  p = Seeded();
  counts = Histogram(p, {ninf, 0.0f, ninf, 0.0f}, 1000);
  EXPECT_EQ(counts[0] + counts[2], 0);
}

}  // namespace
}  // namespace specula
