#include "engine/cpu/top_pages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

// The specification, spelled out slowly: stable sort by score descending (so ties keep the lower
// index first), take k, order by index.
std::vector<int32_t> BruteForce(const std::vector<float>& scores, int32_t k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  idx.resize(std::min<size_t>(idx.size(), k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopPagesTest, MatchesBruteForceIncludingTies) {
  std::mt19937 rng(42);
  std::vector<int32_t> out;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = static_cast<int>(rng() % 200);
    // Few distinct values in half the trials so ties are common.
    const int levels = trial % 2 == 0 ? 4 : 1 << 20;
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(static_cast<int>(rng() % levels)) - 2.0f;
    const int32_t k = static_cast<int32_t>(rng() % (n + 3));
    SelectTopPages(scores, k, &out);
    ASSERT_EQ(out, BruteForce(scores, k)) << "trial " << trial << " n " << n << " k " << k;
  }
}

// The resolve's partition: the best `first` as a set, then the next ones in rank order, exactly
// the ranked list's split (ties to the lower index, as everywhere).
TEST(TopPagesTest, PartitionIsTheRankedListWithItsHeadUnordered) {
  std::mt19937 rng(7);
  std::vector<int32_t> ranked, partitioned;
  for (int trial = 0; trial < 1000; ++trial) {
    const int n = static_cast<int>(rng() % 150);
    std::vector<float> scores(n);
    for (float& s : scores) s = static_cast<float>(static_cast<int>(rng() % 6));
    const int32_t k = static_cast<int32_t>(rng() % (n + 3));
    const int32_t first = k == 0 ? 0 : static_cast<int32_t>(rng() % (k + 1));
    RankTopPages(scores, k, &ranked);
    PartitionTopPages(scores, first, k, &partitioned);
    ASSERT_EQ(partitioned.size(), ranked.size());
    const size_t head = std::min<size_t>(first, ranked.size());
    std::vector<int32_t> a(ranked.begin(), ranked.begin() + head);
    std::vector<int32_t> b(partitioned.begin(), partitioned.begin() + head);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a, b) << "trial " << trial;
    ASSERT_TRUE(std::equal(ranked.begin() + head, ranked.end(), partitioned.begin() + head))
        << "trial " << trial;
  }
}

TEST(TopPagesTest, AllTiedTakesTheLowestIndices) {
  std::vector<float> scores(10, 1.5f);
  std::vector<int32_t> out;
  SelectTopPages(scores, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(TopPagesTest, EdgeSizes) {
  const std::vector<float> scores = {3.0f, -1.0f, 7.0f};
  std::vector<int32_t> out = {99, 98};  // replaced, not appended to
  SelectTopPages(scores, 0, &out);
  EXPECT_TRUE(out.empty());
  SelectTopPages(scores, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2}));
  SelectTopPages(scores, 100, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2}));
  SelectTopPages(scores, 1, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{2}));
  SelectTopPages({}, 5, &out);
  EXPECT_TRUE(out.empty());
}

TEST(TopPagesTest, InfinitiesAndNanRankSanely) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> scores = {nan, -inf, 0.0f, inf, nan, 1.0f};
  std::vector<int32_t> out;
  SelectTopPages(scores, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 5}));
  SelectTopPages(scores, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 5}));
  SelectTopPages(scores, 5, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 5}));
}

// Both ways of sorting a page set (compared below kMarkedSortMinPages, marked from it) give
// std::sort's order, across the threshold and for sets filling their range.
TEST(TopPagesTest, SortPageSetSortsSmallAndLargeSets) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t begin = static_cast<int32_t>(rng() % 5);
    const int32_t span = 1 + static_cast<int32_t>(rng() % 400);
    std::vector<int32_t> all(span);
    std::iota(all.begin(), all.end(), begin);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> pages(all.begin(), all.begin() + rng() % (span + 1));
    std::vector<int32_t> expected = pages;
    std::sort(expected.begin(), expected.end());
    SortPageSet(pages, begin, begin + span);
    ASSERT_EQ(pages, expected) << "trial " << trial << " size " << expected.size();
  }
}

TEST(TopPagesDeathTest, SortPageSetRefusesDuplicatesAndStrays) {
  std::vector<int32_t> large(100);
  std::iota(large.begin(), large.end(), 10);
  large[50] = 12;
  EXPECT_DEATH(SortPageSet(large, 10, 200), "distinct");
  std::vector<int32_t> small = {3, 9};
  EXPECT_DEATH(SortPageSet(small, 0, 5), "distinct");
}

}  // namespace
}  // namespace specula
