#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/exact_selector.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/page_selector.h"
#include "engine/kv/quest_selector.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int kHeadDim = 16;

std::unique_ptr<HostKvStore> MakeStore(int32_t page_size, int64_t tokens) {
  HostKvStoreOptions o;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = kHeadDim;
  o.page_size = page_size;
  o.capacity_tokens = tokens;
  auto store = HostKvStore::Create(o);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

// Keys with per-channel scales and offsets (a few outlier channels, as in real K) so the
// min/max boxes are lopsided rather than symmetric around zero.
std::vector<float> RandomRows(std::mt19937& rng, int rows) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> scale(kHeadDim), offset(kHeadDim);
  for (int c = 0; c < kHeadDim; ++c) {
    scale[c] = (c % 5 == 0) ? 8.0f : 0.5f + static_cast<float>(rng() % 100) / 100.0f;
    offset[c] = normal(rng);
  }
  std::vector<float> out(static_cast<size_t>(rows) * kHeadDim);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < kHeadDim; ++c) out[r * kHeadDim + c] = offset[c] + scale[c] * normal(rng);
  }
  return out;
}

// A store filled with `tokens` random keys in one sequence, every page summarized by both
// selectors (the last page partial when tokens is not a multiple of page_size).
struct Fixture {
  Fixture(int32_t page_size, int64_t tokens, uint32_t seed)
      : store(MakeStore(page_size, tokens)), quest(*store), exact(*store) {
    std::mt19937 rng(seed);
    auto seq_or = store->Reserve(tokens);
    EXPECT_TRUE(seq_or.ok());
    seq = std::move(*seq_or);
    const std::vector<float> keys = RandomRows(rng, static_cast<int>(tokens));
    const std::vector<float> values(kHeadDim, 0.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      store->WriteToken(seq, 0, 0, t, keys.data() + t * kHeadDim, values.data());
    }
    pages.assign(seq.pages(0, 0).begin(), seq.pages(0, 0).end());
    for (size_t i = 0; i < pages.size(); ++i) {
      const int32_t valid =
          static_cast<int32_t>(std::min<int64_t>(page_size, tokens - i * page_size));
      quest.Summarize(pages[i], store->K(pages[i]), valid);
      exact.Summarize(pages[i], store->K(pages[i]), valid);
    }
  }
  ~Fixture() { store->Release(seq); }

  std::vector<float> Scores(const PageSelector& selector, const std::vector<float>& queries,
                            int32_t group) const {
    std::vector<float> scores(pages.size());
    selector.Score(queries, group, pages, absl::MakeSpan(scores));
    return scores;
  }

  std::unique_ptr<HostKvStore> store;
  HostKvSequence seq;
  QuestSelector quest;
  ExactSelector exact;
  std::vector<PageId> pages;
};

// The heart of Quest: its score never falls below the best true q·k in the page, for every page,
// query and group size (the test keys include a partial last page).
TEST(SelectorsTest, QuestUpperBoundsExact) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    Fixture f(/*page_size=*/8, /*tokens=*/8 * 32 + 5, seed);
    std::mt19937 rng(seed + 1000);
    for (int32_t group : {1, 2, 4}) {
      const std::vector<float> q = RandomRows(rng, group);
      const std::vector<float> quest = f.Scores(f.quest, q, group);
      const std::vector<float> exact = f.Scores(f.exact, q, group);
      for (size_t i = 0; i < quest.size(); ++i) {
        // Same summation order and no FMA contraction, so the bound is exact in fp32; the slack
        // only guards against a compiler that contracts one loop and not the other.
        ASSERT_GE(quest[i], exact[i] - 1e-4f * (1.0f + std::fabs(exact[i])))
            << "seed " << seed << " group " << group << " page " << i;
      }
    }
  }
}

TEST(SelectorsTest, QuestEqualsExactWithOneTokenPerPage) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    Fixture f(/*page_size=*/1, /*tokens=*/64, seed);
    std::mt19937 rng(seed + 77);
    const std::vector<float> q = RandomRows(rng, 2);
    const std::vector<float> quest = f.Scores(f.quest, q, 2);
    const std::vector<float> exact = f.Scores(f.exact, q, 2);
    for (size_t i = 0; i < quest.size(); ++i) {
      ASSERT_NEAR(quest[i], exact[i], 1e-5f * (1.0f + std::fabs(exact[i])));
    }
  }
}

// A group's score is the max of its heads' scores, so a page one head needs is never diluted.
TEST(SelectorsTest, GroupScoreIsTheMaxOverQueryHeads) {
  Fixture f(/*page_size=*/8, /*tokens=*/8 * 16, 3);
  std::mt19937 rng(99);
  const int32_t group = 3;
  const std::vector<float> q = RandomRows(rng, group);
  for (const PageSelector* selector :
       {static_cast<const PageSelector*>(&f.quest), static_cast<const PageSelector*>(&f.exact)}) {
    const std::vector<float> together = f.Scores(*selector, q, group);
    std::vector<float> best(together.size(), -std::numeric_limits<float>::infinity());
    for (int h = 0; h < group; ++h) {
      const std::vector<float> one(q.begin() + h * kHeadDim, q.begin() + (h + 1) * kHeadDim);
      const std::vector<float> s = f.Scores(*selector, one, 1);
      for (size_t i = 0; i < s.size(); ++i) best[i] = std::max(best[i], s[i]);
    }
    EXPECT_EQ(together, best) << selector->name();
  }
  // One head points along the longest key (so no other key has a larger dot product with it):
  // that key's page must rank first for the group even though the other heads point elsewhere.
  size_t longest = 0;
  float longest_norm = -1.0f;
  for (size_t i = 0; i < f.pages.size(); ++i) {
    for (int t = 0; t < 8; ++t) {
      const float* key = f.store->K(f.pages[i]) + t * kHeadDim;
      float norm = 0.0f;
      for (int c = 0; c < kHeadDim; ++c) norm += key[c] * key[c];
      if (norm > longest_norm) {
        longest_norm = norm;
        longest = i * 8 + t;
      }
    }
  }
  std::vector<float> aligned(q);
  const float* key = f.store->K(f.pages[longest / 8]) + (longest % 8) * kHeadDim;
  for (int c = 0; c < kHeadDim; ++c) aligned[kHeadDim + c] = 100.0f * key[c];
  const std::vector<float> exact = f.Scores(f.exact, aligned, group);
  EXPECT_EQ(std::max_element(exact.begin(), exact.end()) - exact.begin(),
            static_cast<std::ptrdiff_t>(longest / 8));
}

// Only a partial page's valid keys count: garbage beyond them must not widen Quest's box or enter
// the exact max, and re-summarizing as the page grows (or after reuse, with fewer tokens)
// replaces the previous summary.
TEST(SelectorsTest, PartialPagesUseOnlyValidTokens) {
  auto store = MakeStore(/*page_size=*/8, /*tokens=*/8);
  QuestSelector quest(*store);
  ExactSelector exact(*store);
  auto seq = store->Reserve(8);
  ASSERT_TRUE(seq.ok());
  const PageId page = seq->page(0, 0, 0);
  std::mt19937 rng(5);
  std::vector<float> keys = RandomRows(rng, 8);
  for (int t = 5; t < 8; ++t) {
    for (int c = 0; c < kHeadDim; ++c) keys[t * kHeadDim + c] = (c % 2 ? 1e6f : -1e6f);
  }
  std::copy(keys.begin(), keys.end(), store->K(page));
  auto check = [&](int32_t valid) {
    quest.Summarize(page, store->K(page), valid);
    exact.Summarize(page, store->K(page), valid);
    const absl::Span<const float> s = quest.summary(page);
    for (int c = 0; c < kHeadDim; ++c) {
      float mn = keys[c], mx = keys[c];
      for (int t = 1; t < valid; ++t) {
        mn = std::min(mn, keys[t * kHeadDim + c]);
        mx = std::max(mx, keys[t * kHeadDim + c]);
      }
      ASSERT_EQ(s[c], mn) << "valid " << valid << " channel " << c;
      ASSERT_EQ(s[kHeadDim + c], mx) << "valid " << valid << " channel " << c;
    }
    const std::vector<float> q = RandomRows(rng, 1);
    float want = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < valid; ++t) {
      float dot = 0.0f;
      for (int c = 0; c < kHeadDim; ++c) dot += q[c] * keys[t * kHeadDim + c];
      want = std::max(want, dot);
    }
    const PageId pages[] = {page};
    float got = 0.0f;
    exact.Score(q, 1, pages, absl::MakeSpan(&got, 1));
    EXPECT_FLOAT_EQ(got, want);
    float bound = 0.0f;
    quest.Score(q, 1, pages, absl::MakeSpan(&bound, 1));
    EXPECT_GE(bound, want - 1e-4f);
    EXPECT_LT(bound, 1e5f);  // the garbage channels (±1e6) were not included
  };
  check(1);
  check(3);
  check(5);
  check(2);  // shrinking: as when a released page is reused by a new owner
  store->Release(*seq);
}

TEST(SelectorsTest, FactoryAcceptsKnownNames) {
  auto store = MakeStore(16, 64);
  auto quest = MakePageSelector("quest", *store);
  ASSERT_TRUE(quest.ok()) << quest.status();
  EXPECT_EQ((*quest)->name(), "quest");
  EXPECT_NE(dynamic_cast<QuestSelector*>(quest->get()), nullptr);
  auto exact = MakePageSelector("exact", *store);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ((*exact)->name(), "exact");
  for (const char* bad : {"", "Quest", "lowrank"}) {
    auto s = MakePageSelector(bad, *store);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("quest"));
    EXPECT_THAT(s.status().message(), HasSubstr("exact"));
  }
}

TEST(SelectorsTest, IndexSize) {
  auto store = MakeStore(/*page_size=*/16, /*tokens=*/16 * 10);
  QuestSelector quest(*store);
  // 2 * head_dim floats per page: 2 / page_size of the page's K bytes.
  EXPECT_EQ(quest.index_bytes_per_page(), 2u * kHeadDim * sizeof(float));
  EXPECT_EQ(quest.index_bytes_per_page() * 16, 2 * (store->page_bytes() / 2));
  EXPECT_EQ(quest.index_bytes(),
            static_cast<size_t>(store->capacity_pages()) * quest.index_bytes_per_page());
  ExactSelector exact(*store);
  EXPECT_EQ(exact.index_bytes_per_page(), store->page_bytes() / 2);  // all of K
}

}  // namespace
}  // namespace specula
