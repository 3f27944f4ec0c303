// The prefix index: matches verified token by token at page granularity, references taken and
// dropped exactly once per node, locks that keep paths from eviction, LRU order among leaves.
#include "engine/kv/prefix_tree.h"

#include <map>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using Kind = PrefixTree::LockKind;

// Counts references per page id like a real pool does, so leaks and double releases show.
struct FakePool {
  std::map<int32_t, int> refs;
  PrefixTree::PagePool Pool() {
    return {[this](absl::Span<const int32_t> p) {
              for (int32_t id : p) ++refs[id];
            },
            [this](absl::Span<const int32_t> p) {
              for (int32_t id : p) {
                ASSERT_GT(refs[id], 0) << "page " << id << " released more than retained";
                if (--refs[id] == 0) refs.erase(id);
              }
            }};
  }
};

std::vector<int32_t> Iota(int n, int start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Block b's pages are {100 * tag + b * 2, +1}: two pages per block, distinct per insert.
struct PagesTagged {
  explicit PagesTagged(int t) : tag(t) {}
  absl::Span<const int32_t> operator()(int64_t b) const {
    buf = {tag * 100 + static_cast<int32_t>(b) * 2, tag * 100 + static_cast<int32_t>(b) * 2 + 1};
    return buf;
  }
  int tag;
  mutable std::vector<int32_t> buf;
};

TEST(PrefixTreeTest, MatchesWholeBlocksTokenByToken) {
  FakePool pool;
  PrefixTree tree(4, 2, pool.Pool());
  const std::vector<int32_t> a = Iota(10, 0);  // blocks [0..3] [4..7], tail 8 9
  PrefixTree::Node* leaf = tree.Insert(a, 2, PagesTagged(1));
  EXPECT_EQ(PrefixTree::Depth(leaf), 2);
  EXPECT_EQ(tree.cached_pages(), 4);
  EXPECT_EQ(pool.refs.size(), 4u);

  EXPECT_EQ(tree.Match(a, 10), leaf);
  EXPECT_EQ(PrefixTree::Depth(tree.Match(a, 1)), 1);  // capped by max_blocks
  std::vector<int32_t> b = a;
  b[6] = 99;  // second block differs in one token
  EXPECT_EQ(PrefixTree::Depth(tree.Match(b, 10)), 1);
  b[0] = 99;
  EXPECT_EQ(tree.Match(b, 10), nullptr);
  EXPECT_EQ(tree.Match(Iota(3, 0), 10), nullptr);  // shorter than a block

  std::vector<int32_t> pages;
  tree.PathPages(leaf, &pages);
  EXPECT_THAT(pages, ::testing::ElementsAre(100, 101, 102, 103));
}

TEST(PrefixTreeTest, InsertKeepsExistingBlocksAndBranches) {
  FakePool pool;
  PrefixTree tree(4, 2, pool.Pool());
  std::vector<int32_t> a = Iota(8, 0);
  std::vector<int32_t> b = a;
  b[5] = 50;
  tree.Insert(a, 2, PagesTagged(1));
  PrefixTree::Node* nb = tree.Insert(b, 2, PagesTagged(2));
  // The shared first block keeps insert 1's pages; only b's second block is new.
  std::vector<int32_t> pages;
  tree.PathPages(nb, &pages);
  EXPECT_THAT(pages, ::testing::ElementsAre(100, 101, 202, 203));
  EXPECT_EQ(tree.cached_pages(), 6);
  EXPECT_EQ(pool.refs.count(200), 0u) << "a block already cached takes no new reference";
}

TEST(PrefixTreeTest, LocksKeepPathsAndEvictionIsLeastRecentlyUsedFirst) {
  FakePool pool;
  PrefixTree tree(4, 2, pool.Pool());
  std::vector<int32_t> a = Iota(8, 0), b = Iota(8, 0), c = Iota(8, 0);
  b[4] = 40;
  c[4] = 41;
  PrefixTree::Node* na = tree.Insert(a, 2, PagesTagged(1));
  PrefixTree::Node* nb = tree.Insert(b, 2, PagesTagged(2));
  tree.Insert(c, 2, PagesTagged(3));
  EXPECT_EQ(tree.evictable_pages(), 8);

  tree.Lock(nb, Kind::kRunning);  // b's path (root block + b's leaf) is pinned
  tree.Lock(na, Kind::kSession);  // then a is used: c is now the oldest leaf
  EXPECT_EQ(tree.evictable_pages(), 2);     // c's leaf only
  EXPECT_EQ(tree.reclaimable_pages(), 4);   // c's leaf and a's leaf (only a session holds it)

  EXPECT_EQ(tree.Evict(100), 2);  // only c's leaf can go
  EXPECT_EQ(pool.refs.count(302), 0u);
  EXPECT_EQ(PrefixTree::Depth(tree.Match(c, 2)), 1);
  EXPECT_EQ(tree.Match(b, 2), nb);

  tree.Unlock(na, Kind::kSession);
  EXPECT_EQ(tree.EvictPath(na), 2);  // a's leaf; the shared root block is still locked by b
  EXPECT_EQ(tree.cached_pages(), 4);
  tree.Unlock(nb, Kind::kRunning);
  EXPECT_EQ(tree.evictable_pages(), 4);
  EXPECT_EQ(tree.Evict(1), 2);  // stops once enough is released: b's leaf, not the root block
  EXPECT_EQ(tree.cached_pages(), 2);
  EXPECT_EQ(tree.Evict(100), 2);
  EXPECT_TRUE(pool.refs.empty());
}

TEST(PrefixTreeTest, OlderLeafGoesFirst) {
  FakePool pool;
  PrefixTree tree(4, 1, pool.Pool());
  const std::vector<int32_t> page1 = {1}, page2 = {2};
  std::vector<int32_t> a = Iota(4, 0), b = Iota(4, 10);
  PrefixTree::Node* na = tree.Insert(a, 1, [&](int64_t) { return absl::MakeConstSpan(page1); });
  tree.Insert(b, 1, [&](int64_t) { return absl::MakeConstSpan(page2); });
  tree.Lock(na, Kind::kRunning);  // touching a makes b the least recently used
  tree.Unlock(na, Kind::kRunning);
  EXPECT_EQ(tree.Evict(1), 1);
  EXPECT_EQ(pool.refs.count(2), 0u);
  EXPECT_EQ(pool.refs.count(1), 1u);
}

TEST(PrefixTreeTest, DestructionDropsTheTreesReferencesEvenWhileLocked) {
  FakePool pool;
  {
    PrefixTree tree(4, 2, pool.Pool());
    tree.Lock(tree.Insert(Iota(8, 0), 2, PagesTagged(1)), Kind::kRunning);
  }
  EXPECT_TRUE(pool.refs.empty());
}

// Tails (partly filled last pages): matched by their first tokens against a block's tails and
// children, never past max_tokens or a page; an equal tail is kept once; a tail that a longer
// sibling holds goes once nothing locks it; tails are leaves for eviction and accounting.
TEST(PrefixTreeTest, TailsMatchByTheirFirstTokensAndGoWhenSomethingHoldsThemAll) {
  FakePool pool;
  PrefixTree tree(4, 2, pool.Pool());
  const std::vector<int32_t> a = Iota(7, 0);  // block [0..3], tail 4 5 6
  PrefixTree::Node* block = tree.Insert(a, 1, PagesTagged(1));
  PrefixTree::Node* tail = tree.InsertTail(block, absl::MakeConstSpan(a).subspan(4), PagesTagged(2)(0));
  EXPECT_EQ(tree.Tokens(tail), 7);
  EXPECT_EQ(PrefixTree::Depth(tail), 2);
  EXPECT_EQ(tree.cached_pages(), 4);
  EXPECT_EQ(tree.InsertTail(block, absl::MakeConstSpan(a).subspan(4), PagesTagged(3)(0)), tail);
  EXPECT_EQ(pool.refs.count(300), 0u) << "an equal tail is cached once";

  std::vector<int32_t> rest = {4, 5, 9, 9};
  PrefixTree::TailMatch m = tree.MatchTail(block, rest, 10);
  EXPECT_EQ(m.node, tail);
  EXPECT_EQ(m.tokens, 2);
  EXPECT_EQ(tree.MatchTail(block, rest, 1).tokens, 1) << "capped by max_tokens";
  EXPECT_EQ(tree.MatchTail(block, {7, 7}, 10).node, nullptr);
  // A whole child block's first tokens match as well, never all of its page.
  const std::vector<int32_t> b = Iota(8, 0);
  PrefixTree::Node* full = tree.Insert(b, 2, PagesTagged(4));
  EXPECT_EQ(tree.MatchTail(block, {4, 5, 6, 7, 8}, 10).tokens, 3);
  EXPECT_EQ(tree.MatchTail(nullptr, {0, 1, 2, 3}, 10).tokens, 3) << "the root's children";

  // The new block [4..7] holds all the tail holds: the tail went when it was inserted.
  EXPECT_TRUE(block->tails.empty());
  EXPECT_EQ(pool.refs.count(200), 0u);
  // A locked tail stays until unlocked, then goes if dominated.
  PrefixTree::Node* short_tail = tree.InsertTail(block, std::vector<int32_t>{4}, PagesTagged(5)(0));
  tree.Lock(short_tail, Kind::kSession);
  tree.DropIfDominated(short_tail);
  EXPECT_EQ(block->tails.size(), 1u);
  tree.Unlock(short_tail, Kind::kSession);
  tree.DropIfDominated(short_tail);
  EXPECT_TRUE(block->tails.empty());
  EXPECT_EQ(pool.refs.count(500), 0u);

  // Tails are leaves: eviction takes them, and everything is released once.
  tree.InsertTail(full, std::vector<int32_t>{8, 9}, PagesTagged(6)(0));
  EXPECT_EQ(tree.cached_pages(), 6);
  EXPECT_EQ(tree.Evict(100), 6);
  EXPECT_TRUE(pool.refs.empty());
}

}  // namespace
}  // namespace specula
