#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

TEST(PercentileTest, MatchesNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(SummarizeTest, SortsAndAverages) {
  const Distribution d = Summarize({10, 0, 5, 20, 15});
  EXPECT_EQ(d.count, 5u);
  EXPECT_DOUBLE_EQ(d.mean, 10);
  EXPECT_DOUBLE_EQ(d.p50, 10);
  EXPECT_DOUBLE_EQ(d.p90, 18);
  EXPECT_NEAR(d.p99, 19.8, 1e-12);
}

TEST(SummarizeTest, EmptyIsAllZero) {
  const Distribution d = Summarize({});
  EXPECT_EQ(d.count, 0u);
  EXPECT_EQ(d.mean, 0);
  EXPECT_EQ(d.p99, 0);
}

TEST(InterTokenLatencyTest, SplitsCoalescedMessagesEvenly) {
  // First token at 0.1 s; then one token after 0.02 s; then 3 tokens in one message 0.06 s later.
  std::vector<double> itl;
  AppendInterTokenLatencies({{0.10, 1}, {0.12, 1}, {0.18, 3}}, &itl);
  EXPECT_THAT(itl, ElementsAre(DoubleNear(0.02, 1e-12), DoubleNear(0.02, 1e-12),
                               DoubleNear(0.02, 1e-12), DoubleNear(0.02, 1e-12)));
}

TEST(InterTokenLatencyTest, FirstMessageExtrasAndEmptyMessagesGiveNoSamples) {
  std::vector<double> itl;
  AppendInterTokenLatencies({{0.10, 2}, {0.11, 0}, {0.14, 2}}, &itl);
  EXPECT_THAT(itl, ElementsAre(DoubleNear(0.02, 1e-12), DoubleNear(0.02, 1e-12)));
}

RequestRecord Record(double e2e, std::vector<StreamMessage> messages, int prompt = 8) {
  RequestRecord r;
  r.ok = true;
  r.prompt_tokens = prompt;
  r.e2e_seconds = e2e;
  r.messages = std::move(messages);
  return r;
}

TEST(SummarizeRunTest, ThroughputLatenciesAndFailures) {
  std::vector<RequestRecord> records;
  // 5 tokens: TTFT 0.1, TPOT (0.5 - 0.1) / 4 = 0.1.
  records.push_back(Record(0.5, {{0.1, 1}, {0.2, 1}, {0.3, 1}, {0.5, 2}}));
  // 1 token: TTFT but no TPOT.
  records.push_back(Record(0.3, {{0.3, 1}}));
  records[0].cached_prompt_tokens = 6;
  RequestRecord failed;
  failed.status_code = 8;  // RESOURCE_EXHAUSTED
  failed.prompt_tokens = 100;
  failed.cached_prompt_tokens = 100;  // a failed request counts in neither
  records.push_back(failed);
  records.push_back(failed);

  const BenchSummary s = SummarizeRun(records, 2.0);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.failures_by_code.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(s.input_tokens, 16);
  EXPECT_EQ(s.cached_input_tokens, 6);
  EXPECT_EQ(s.output_tokens, 6);
  EXPECT_EQ(s.messages, 5);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(s.total_throughput, 11.0);
  EXPECT_DOUBLE_EQ(s.messages_per_token, 5.0 / 6.0);
  EXPECT_EQ(s.ttft.count, 2u);
  EXPECT_DOUBLE_EQ(s.ttft.mean, 0.2);
  EXPECT_EQ(s.tpot.count, 1u);
  EXPECT_DOUBLE_EQ(s.tpot.mean, 0.1);
  EXPECT_EQ(s.itl.count, 4u);  // 1 + 1 + 2: the first request's tokens after its first
  EXPECT_NEAR(s.itl.mean, 0.1, 1e-12);
  EXPECT_EQ(s.e2e.count, 2u);
  EXPECT_DOUBLE_EQ(s.e2e.mean, 0.4);
}

TEST(PoissonArrivalsTest, GapsAreExponentialWithMeanOneOverRate) {
  PoissonArrivals arrivals(20.0, 42);
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  int below_mean = 0;
  for (int i = 0; i < n; ++i) {
    const double g = arrivals.NextGapSeconds();
    ASSERT_GT(g, 0);
    ASSERT_TRUE(std::isfinite(g));
    sum += g;
    sum_sq += g * g;
    below_mean += g < 0.05 ? 1 : 0;
  }
  const double mean = sum / n;
  // Standard error of the mean is 0.05 / sqrt(n) ~ 1.1e-4: 1e-3 is ~9 sigma.
  EXPECT_NEAR(mean, 0.05, 1e-3);
  // Exponential: standard deviation equals the mean, P(gap < mean) = 1 - 1/e.
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 0.05, 2e-3);
  EXPECT_NEAR(static_cast<double>(below_mean) / n, 1 - std::exp(-1.0), 5e-3);
}

TEST(PoissonArrivalsTest, SeededAndInfiniteRate) {
  EXPECT_EQ(ArrivalOffsets(50, 4.0, 7), ArrivalOffsets(50, 4.0, 7));
  EXPECT_NE(ArrivalOffsets(50, 4.0, 7), ArrivalOffsets(50, 4.0, 8));
  const std::vector<double> offsets = ArrivalOffsets(3, 4.0, 7);
  EXPECT_EQ(offsets[0], 0);
  EXPECT_LT(offsets[0], offsets[1]);
  EXPECT_LT(offsets[1], offsets[2]);
  EXPECT_THAT(ArrivalOffsets(3, std::numeric_limits<double>::infinity(), 7), ElementsAre(0, 0, 0));
}

TEST(RandomPromptsTest, SeededIdsInRange) {
  const auto a = RandomPrompts(4, 1000, 50, 3);
  EXPECT_EQ(a, RandomPrompts(4, 1000, 50, 3));
  EXPECT_NE(a, RandomPrompts(4, 1000, 50, 4));
  ASSERT_EQ(a.size(), 4u);
  std::set<int32_t> seen;
  for (const auto& p : a) {
    ASSERT_EQ(p.size(), 1000u);
    for (int32_t id : p) {
      ASSERT_GE(id, 1);
      ASSERT_LT(id, 50);
      seen.insert(id);
    }
  }
  EXPECT_EQ(seen.size(), 49u);  // every id in [1, 50) turns up in 4000 draws
}

}  // namespace
}  // namespace specula
