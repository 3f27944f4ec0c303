// The sparse cache's device operations (engine/backend/sparse_ops.h) on the CPU backend, the
// reference the CUDA kernels are compared with: scoring (quest's bound, the GQA rule, exact),
// selection (hit / late / missed, attend lists, staging that never evicts what the step uses), the
// copy stream's gather, window retirement and page completion; and the backend's refusal of a host
// pointer where backend memory is due.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv/selection_index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu/device_data.h"
#include "tests/engine/cpu/sparse_world.h"

namespace specula {
namespace {

using ::specula::testing::DeviceData;
using ::specula::testing::SparseWorld;
using ::specula::testing::WorldShape;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Keys with per-channel scales and offsets (a few outlier channels, as in real K) so the
// min/max boxes are lopsided rather than symmetric around zero.
std::vector<float> RandomRows(std::mt19937& rng, int rows, int dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> scale(dim), offset(dim);
  for (int c = 0; c < dim; ++c) {
    scale[c] = (c % 5 == 0) ? 8.0f : 0.5f + static_cast<float>(rng() % 100) / 100.0f;
    offset[c] = normal(rng);
  }
  std::vector<float> out(static_cast<size_t>(rows) * dim);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < dim; ++c) out[r * dim + c] = offset[c] + scale[c] * normal(rng);
  }
  return out;
}

// A world of `pages` full pages of random keys, one KV head of `group` query heads, summarized.
struct ScoringSetup {
  static WorldShape Shape(int32_t page_size, int32_t pages, int32_t group, DType dtype) {
    WorldShape s;
    s.kv_heads = 1;
    s.heads = group;
    s.page_size = page_size;
    s.sink_pages = 0;
    s.window_pages = 0;
    s.budget_pages = 1;  // fewer than the candidates: the row is scored
    s.cache_slots = 1;
    s.tokens = page_size * (pages + 1);
    s.dtype = dtype;
    return s;
  }
  ScoringSetup(int32_t page_size, int32_t pages, int32_t group, uint32_t seed,
               DType dtype = DType::kF32)
      : world(backend, Shape(page_size, pages, group, dtype)), pages(pages) {
    std::mt19937 rng(seed);
    keys = RandomRows(rng, page_size * pages, 16);
    world.FillHost(page_size * pages,
                   [&](int32_t, int32_t, int32_t pos, int32_t c) { return keys[pos * 16 + c]; });
    index = SelectionIndex::Create("quest", backend, world.store().capacity_pages(), 16).value();
    std::vector<int32_t> ids;
    for (int32_t p = 0; p < pages; ++p) ids.push_back(world.host_page(0, 0, p));
    backend.SummarizePages(PageSummaryArgs{world.data().Put(ids), world.data().Put(ids),
                                           world.host_pool(), index->summaries()});
    row = world.Row(page_size * pages, 1);  // the current page follows the candidates
  }
  // Scores of every page for `queries` [group][16] with `scoring`.
  std::vector<float> Scores(const std::vector<float>& queries, PageScoring scoring) {
    DeviceData& d = world.data();
    const DeviceSpan<const float> q = d.Put(queries);
    SparseScoreArgs a;
    a.rows = d.Put(std::vector<SparseRowPlan>{row});
    a.num_heads = world.shape().heads;
    a.num_kv_heads = 1;
    a.max_candidates = row.candidates;
    a.scoring = scoring;
    a.summaries = index->summaries();
    a.host_pool = world.host_pool();
    a.scores = d.Zeros<float>(row.candidates);
    backend.ScorePages(Mat(const_cast<float*>(q.data()), 1, static_cast<int64_t>(queries.size())),
                       a);
    return d.Get(a.scores);
  }

  CpuBackend backend{2};
  SparseWorld world;
  int32_t pages;
  std::vector<float> keys;
  std::unique_ptr<SelectionIndex> index;
  SparseRowPlan row;
};

// The heart of Quest: its score never falls below the best true q·k in the page, for every page,
// query and group size, in every KV dtype (the summary is of the rounded keys attention reads).
TEST(SparseOpsTest, QuestUpperBoundsExact) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (uint32_t seed = 0; seed < 10; ++seed) {
      for (int32_t group : {1, 2, 4}) {
        ScoringSetup s(/*page_size=*/8, /*pages=*/32, group, seed, dtype);
        std::mt19937 rng(seed + 1000);
        const std::vector<float> q = RandomRows(rng, group, 16);
        const std::vector<float> quest = s.Scores(q, PageScoring::kQuest);
        const std::vector<float> exact = s.Scores(q, PageScoring::kExact);
        ASSERT_EQ(quest.size(), 32u);
        for (size_t i = 0; i < quest.size(); ++i) {
          // Per channel the bound's term is at least q·k's; the slack covers the two sums'
          // different orders (8 lanes and a tree against Dot's 16 lanes in a row).
          ASSERT_GE(quest[i], exact[i] - 1e-4f * (1.0f + std::fabs(exact[i])))
              << "seed " << seed << " group " << group << " page " << i;
        }
      }
    }
  }
}

TEST(SparseOpsTest, QuestEqualsExactWithOneTokenPerPage) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    ScoringSetup s(/*page_size=*/1, /*pages=*/64, /*group=*/2, seed);
    std::mt19937 rng(seed + 77);
    const std::vector<float> q = RandomRows(rng, 2, 16);
    const std::vector<float> quest = s.Scores(q, PageScoring::kQuest);
    const std::vector<float> exact = s.Scores(q, PageScoring::kExact);
    for (size_t i = 0; i < quest.size(); ++i) {
      ASSERT_NEAR(quest[i], exact[i], 1e-5f * (1.0f + std::fabs(exact[i])));
    }
  }
}

// A group's score is the max of its heads' scores, so a page one head needs is never diluted.
TEST(SparseOpsTest, GroupScoreIsTheMaxOverQueryHeads) {
  const int32_t group = 3;
  ScoringSetup together_setup(/*page_size=*/8, /*pages=*/16, group, 3);
  ScoringSetup alone_setup(/*page_size=*/8, /*pages=*/16, /*group=*/1, 3);
  std::mt19937 rng(99);
  const std::vector<float> q = RandomRows(rng, group, 16);
  for (PageScoring scoring : {PageScoring::kQuest, PageScoring::kExact}) {
    const std::vector<float> together = together_setup.Scores(q, scoring);
    std::vector<float> best(together.size(), -std::numeric_limits<float>::infinity());
    for (int h = 0; h < group; ++h) {
      const std::vector<float> one(q.begin() + h * 16, q.begin() + (h + 1) * 16);
      const std::vector<float> s = alone_setup.Scores(one, scoring);
      for (size_t i = 0; i < s.size(); ++i) best[i] = std::max(best[i], s[i]);
    }
    EXPECT_EQ(together, best) << static_cast<int>(scoring);
  }
}

// Summaries are the per-channel min and max of the page's keys as stored (rounded to bf16 here).
TEST(SparseOpsTest, SummariesAreTheMinAndMaxOfTheStoredKeys) {
  ScoringSetup s(/*page_size=*/8, /*pages=*/4, /*group=*/1, 11, DType::kBF16);
  std::vector<float> table(static_cast<size_t>(s.world.store().capacity_pages()) * 32);
  s.backend.CopyToHost(table.data(), s.index->summaries(), table.size() * sizeof(float));
  for (int32_t p = 0; p < 4; ++p) {
    const float* summary = table.data() + static_cast<size_t>(s.world.host_page(0, 0, p)) * 32;
    for (int c = 0; c < 16; ++c) {
      float mn = std::numeric_limits<float>::infinity(), mx = -mn;
      for (int t = 0; t < 8; ++t) {
        const float k = Bf16ToFloat(FloatToBf16(s.keys[(p * 8 + t) * 16 + c]));
        mn = std::min(mn, k);
        mx = std::max(mx, k);
      }
      ASSERT_EQ(summary[c], mn) << "page " << p << " channel " << c;
      ASSERT_EQ(summary[16 + c], mx) << "page " << p << " channel " << c;
    }
  }
}

TEST(SparseOpsTest, SelectionIndexNamesAndSizes) {
  CpuBackend backend(1);
  auto quest = SelectionIndex::Create("quest", backend, 10, 16).value();
  EXPECT_EQ(quest->scoring(), PageScoring::kQuest);
  EXPECT_NE(quest->summaries(), nullptr);
  // 2 * head_dim floats per page: 2 / page_size of a page's K bytes (16 tokens, fp32).
  EXPECT_EQ(quest->index_bytes_per_page(16 * 16 * 4), 2u * 16 * sizeof(float));
  auto exact = SelectionIndex::Create("exact", backend, 10, 16).value();
  EXPECT_EQ(exact->scoring(), PageScoring::kExact);
  EXPECT_EQ(exact->summaries(), nullptr);
  EXPECT_EQ(exact->index_bytes_per_page(1024), 1024u);  // all of K
  for (const char* bad : {"", "Quest", "lowrank"}) {
    auto s = SelectionIndex::Create(bad, backend, 10, 16);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("quest|exact"));
  }
}

// Selection on a hand-made state. 20 pages of 4 tokens; S = 1 sink page, W = 1 window page,
// B = 3, C = 5. Page p's keys point along channel p, so a query with weight on channels picks
// exactly those pages. The row sits at position 60: current page 15, window 14..15, candidates
// 1..13.
class SelectTest : public ::testing::Test {
 protected:
  static WorldShape Shape() {
    WorldShape s;
    s.kv_heads = 2;
    s.heads = 4;
    s.head_dim = 32;
    s.tokens = 80;
    return s;
  }
  void SetUp() override {
    world_.FillHost(
        64, [](int32_t, int32_t, int32_t pos, int32_t c) { return c == pos / 4 ? 10.0f : 0.0f; });
    std::vector<int32_t> ids;
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t p = 0; p < 15; ++p) ids.push_back(world_.host_page(0, h, p));
    }
    index_ = SelectionIndex::Create("quest", backend_, world_.store().capacity_pages(), 32).value();
    backend_.SummarizePages(PageSummaryArgs{world_.data().Put(ids), world_.data().Put(ids),
                                            world_.host_pool(), index_->summaries()});
    // Head 0: slot 0 holds page 7 (ready), slot 1 page 9 (its copy in flight), slot 2 page 5
    // (ready, unneeded); slots 3 and 4 are free. Head 1 holds nothing.
    SetSlot(0, 0, 7, kSlotReady, UseStamp(1));
    SetSlot(0, 1, 9, kSlotLoading, PredictStamp(2));
    SetSlot(0, 2, 5, kSlotReady, UseStamp(1));
  }
  void SetSlot(int32_t head, int32_t j, int32_t page, int32_t state, uint32_t stamp) {
    world_.SetSlot(0, head, j, page, state, stamp);
  }
  // Query weights: pages 3, 7 and 9 needed (score 20), 11 then 12 next (10, 5).
  std::vector<float> Query() const {
    std::vector<float> q(4 * 32, 0.0f);
    for (int h = 0; h < 4; ++h) {
      for (int p : {3, 7, 9}) q[h * 32 + p] = 2.0f;
      q[h * 32 + 11] = 1.0f;
      q[h * 32 + 12] = 0.5f;
    }
    return q;
  }
  struct Outcome {
    std::vector<int32_t> pages[2], tokens[2];  // attend lists per head
    std::vector<PageGatherEntry> copies[2];
    std::vector<int64_t> counters;  // [head][kSparseCounterCount]
  };
  Outcome Resolve(bool defer, bool stage_ranked, uint32_t step = 2, int32_t correct_pages = 0) {
    DeviceData& d = world_.data();
    SparseRowPlan row = world_.Row(60, step);
    row.list_capacity = world_.ws().geometry().list_capacity();
    row.correct_pages = correct_pages;
    const auto rows = d.Put(std::vector<SparseRowPlan>{row});
    const DeviceSpan<const float> q = d.Put(Query());
    SparseScoreArgs score;
    score.rows = rows;
    score.num_heads = 4;
    score.num_kv_heads = 2;
    score.max_candidates = row.candidates;
    score.summaries = index_->summaries();
    score.host_pool = world_.host_pool();
    score.scores = d.Zeros<float>(2 * row.candidates);
    const Mat qm(const_cast<float*>(q.data()), 1, 4 * 32);
    backend_.ScorePages(qm, score);
    SparseSelectArgs a;
    a.rows = rows;
    a.num_kv_heads = 2;
    a.page_size = 4;
    a.mode = SelectMode::kResolve;
    a.max_cache_slots = 5;
    a.stage_ranked = stage_ranked;
    a.defer_missing = defer;
    a.scores = score.scores;
    a.device_pool = world_.device_pool();
    a.host_pool = world_.host_pool();
    a.list_pages = d.Zeros<int32_t>(2 * row.list_capacity);
    a.list_tokens = d.Zeros<int32_t>(2 * row.list_capacity);
    a.list_count = d.Zeros<int32_t>(2);
    a.staging.copy_stride = 5;
    a.staging.copies = d.Zeros<PageGatherEntry>(2 * 5);
    a.staging.copy_count = d.Zeros<int32_t>(2);
    a.counters = d.Zeros<int64_t>(2 * kSparseCounterCount);
    backend_.SelectPages(a);
    staging_ = a.staging;
    Outcome o;
    const std::vector<int32_t> pages = d.Get(a.list_pages), tokens = d.Get(a.list_tokens),
                               count = d.Get(a.list_count),
                               copy_count = d.Get(a.staging.copy_count);
    const std::vector<PageGatherEntry> copies = d.Get(a.staging.copies);
    for (int h = 0; h < 2; ++h) {
      const int first = h * row.list_capacity;
      o.pages[h].assign(pages.begin() + first, pages.begin() + first + count[h]);
      o.tokens[h].assign(tokens.begin() + first, tokens.begin() + first + count[h]);
      o.copies[h].assign(copies.begin() + h * 5, copies.begin() + h * 5 + copy_count[h]);
    }
    o.counters = d.Get(a.counters);
    return o;
  }
  int32_t Slot(int32_t j, int32_t head = 0) const {
    return world_.pool_page(world_.ws().cache_slot(j), head);
  }
  int32_t Ring(int32_t page, int32_t head = 0) const {
    return world_.pool_page(world_.ws().ring_slot(page), head);
  }
  int32_t Host(int32_t page, int32_t head = 0) const {
    return HostPageRef(world_.host_page(0, head, page));
  }

  CpuBackend backend_{2};
  SparseWorld world_{backend_, Shape()};
  std::unique_ptr<SelectionIndex> index_;
  PageStaging staging_;
};

TEST_F(SelectTest, ResolveClassifiesListsAndStagesWithoutEvictingTheStepsPages) {
  const Outcome o = Resolve(/*defer=*/false, /*stage_ranked=*/true);
  // Sink, the selected pages in position order (3 missed and 9 late: read from the host; 7 a
  // hit: its slot), then the window, the current page holding one token.
  EXPECT_THAT(o.pages[0],
              ElementsAre(world_.pool_page(0, 0), Host(3), Slot(0), Host(9), Ring(14), Ring(15)));
  EXPECT_THAT(o.tokens[0], ElementsAre(4, 4, 4, 4, 4, 1));
  const int64_t* head0 = o.counters.data();
  EXPECT_EQ(head0[kCounterHit], 1);
  EXPECT_EQ(head0[kCounterLate], 1);
  EXPECT_EQ(head0[kCounterMissed], 1);
  EXPECT_EQ(head0[kCounterFetched], 2);
  // Staged for the next step: the miss 3, then 11 and 12 ranked below the cut. Free slots go
  // first (3, 4); then the least recent slot not used this step: 2 (page 5), never slot 0 (page
  // 7, used now) nor slot 1 (its copy in flight).
  EXPECT_EQ(head0[kCounterStaged], 3);
  ASSERT_EQ(o.copies[0].size(), 3u);
  const SparseWorld::HeadState s = world_.Read(0, 0);
  EXPECT_THAT(s.slot_page, ElementsAre(7, 9, 12, 3, 11));
  EXPECT_THAT(s.slot_state,
              ElementsAre(kSlotReady, kSlotLoading, kSlotLoading, kSlotLoading, kSlotLoading));
  EXPECT_EQ(s.page_slot[5], -1);  // evicted
  EXPECT_EQ(s.slot_stamp[0], UseStamp(2));
  EXPECT_EQ(s.slot_stamp[3], PredictStamp(3));
  EXPECT_EQ(o.copies[0][0].src, world_.host_pool().page(world_.host_page(0, 0, 3)));
  EXPECT_EQ(o.copies[0][0].dst, world_.device_pool().page(Slot(3)));
  // Head 1 holds nothing: three misses read from the host, all staged.
  EXPECT_THAT(o.pages[1], ElementsAre(world_.pool_page(0, 1), Host(3, 1), Host(7, 1), Host(9, 1),
                                      Ring(14, 1), Ring(15, 1)));
  EXPECT_EQ(o.counters[kSparseCounterCount + kCounterMissed], 3);
}

// With no free slot, claims take the least recently stamped ready slot first, ties to the lower
// index. The stamps 255 and 257 differ in their second byte against their first, so a victim
// order built from the low byte alone (or unstably) claims other slots.
TEST_F(SelectTest, ClaimsEvictTheLeastRecentStampFirstAndTiesByIndex) {
  SetSlot(0, 2, 5, kSlotReady, UseStamp(128));  // 257
  SetSlot(0, 3, 4, kSlotReady, UseStamp(127));  // 255: the oldest
  SetSlot(0, 4, 6, kSlotReady, UseStamp(128));  // 257, after slot 2
  const Outcome o = Resolve(/*defer=*/false, /*stage_ranked=*/true, /*step=*/200);
  // Staged in rank order: the miss 3, then 11 and 12; slot 0 (page 7, used now) and slot 1 (its
  // copy in flight) are never victims.
  ASSERT_EQ(o.copies[0].size(), 3u);
  EXPECT_THAT(world_.Read(0, 0).slot_page, ElementsAre(7, 9, 11, 3, 12));
}

// A free slot goes before any ready one, even one stamped 0 (a prediction for step 0): the
// victim keys' flag bit, not the stamp, orders the two kinds.
TEST_F(SelectTest, ClaimsTakeFreeSlotsBeforeAReadySlotStampedZero) {
  SetSlot(0, 2, 5, kSlotReady, PredictStamp(0));
  const Outcome o = Resolve(/*defer=*/false, /*stage_ranked=*/true);
  ASSERT_EQ(o.copies[0].size(), 3u);
  // Free slots 3 and 4 take the miss 3 and then 11; slot 2 (page 5) goes last, to 12.
  EXPECT_THAT(world_.Read(0, 0).slot_page, ElementsAre(7, 9, 12, 3, 11));
}

TEST_F(SelectTest, DeferAttendsALatePageFromItsSlotAndLeavesAMissOutForTheNextStep) {
  const Outcome o = Resolve(/*defer=*/true, /*stage_ranked=*/false);
  // 3 (no slot) is left out; 7 (a hit) and 9 (late: its copy in flight, which the caller waits
  // for before attention) are read from their slots; nothing from the host store.
  EXPECT_THAT(o.pages[0],
              ElementsAre(world_.pool_page(0, 0), Slot(0), Slot(1), Ring(14), Ring(15)));
  EXPECT_THAT(o.tokens[0], ElementsAre(4, 4, 4, 4, 1));
  EXPECT_EQ(o.counters[kCounterHit], 1);
  EXPECT_EQ(o.counters[kCounterLate], 1);
  EXPECT_EQ(o.counters[kCounterMissed], 1);
  EXPECT_EQ(o.counters[kCounterFetched], 0);
  ASSERT_EQ(o.copies[0].size(), 1u);  // page 3 (no cross_step: nothing ranked below the cut)
  EXPECT_EQ(o.copies[0][0].src, world_.host_pool().page(world_.host_page(0, 0, 3)));
  // Head 1 holds nothing: sinks and the window only; its three misses staged.
  EXPECT_THAT(o.pages[1], ElementsAre(world_.pool_page(0, 1), Ring(14, 1), Ring(15, 1)));
  EXPECT_EQ(o.copies[1].size(), 3u);
}

// With correct_pages 1, defer reads a miss among the best-ranked page of the selection from the
// host store at once; the other misses wait. Pages 3, 7 and 9 tie at the top: the lowest index
// ranks first, so 3 is the best.
TEST_F(SelectTest, DeferCorrectsOnlyTheMissesRankedAmongTheBest) {
  const Outcome o = Resolve(/*defer=*/true, /*stage_ranked=*/false, /*step=*/2,
                            /*correct_pages=*/1);
  EXPECT_THAT(o.pages[0],
              ElementsAre(world_.pool_page(0, 0), Host(3), Slot(0), Slot(1), Ring(14), Ring(15)));
  const int64_t* head0 = o.counters.data();
  EXPECT_EQ(head0[kCounterMissed], 1);
  EXPECT_EQ(head0[kCounterCorrected], 1);
  EXPECT_EQ(head0[kCounterFetched], 1);
  EXPECT_EQ(head0[kCounterLate], 1);
  ASSERT_EQ(o.copies[0].size(), 1u);  // the corrected miss is still staged for the next step
  // Head 1 misses all three: 3 corrected, 7 and 9 left out.
  EXPECT_THAT(o.pages[1],
              ElementsAre(world_.pool_page(0, 1), Host(3, 1), Ring(14, 1), Ring(15, 1)));
  const int64_t* head1 = o.counters.data() + kSparseCounterCount;
  EXPECT_EQ(head1[kCounterMissed], 3);
  EXPECT_EQ(head1[kCounterCorrected], 1);
  EXPECT_EQ(head1[kCounterFetched], 1);
}

TEST_F(SelectTest, DeferCorrectingTheWholeBudgetReadsEveryMissLikeFetch) {
  const Outcome o = Resolve(/*defer=*/true, /*stage_ranked=*/false, /*step=*/2,
                            /*correct_pages=*/3);
  // Misses from the host as under fetch; the late page 9 still from its slot.
  EXPECT_THAT(o.pages[0],
              ElementsAre(world_.pool_page(0, 0), Host(3), Slot(0), Slot(1), Ring(14), Ring(15)));
  EXPECT_THAT(o.pages[1], ElementsAre(world_.pool_page(0, 1), Host(3, 1), Host(7, 1), Host(9, 1),
                                      Ring(14, 1), Ring(15, 1)));
  EXPECT_EQ(o.counters[kSparseCounterCount + kCounterCorrected], 3);
}

TEST_F(SelectTest, TheCopyStreamsGatherLandsTheStagedPagesAndMarksThemReady) {
  Resolve(/*defer=*/false, /*stage_ranked=*/true);
  auto stream = backend_.CreateStream();
  int32_t* gathered = nullptr;
  auto counter = backend_.AllocatePinnedHost(sizeof(int32_t)).value();
  gathered = counter.as<int32_t>();
  *gathered = -1;
  stream->Wait(backend_.compute_stream().Record());
  backend_.GatherPages(*stream, PageGatherArgs{staging_.copies, staging_.copy_count, 2, 5,
                                               world_.host_pool().page_bytes(), gathered});
  stream->Synchronize();
  EXPECT_EQ(*gathered, 3 + 5);  // head 0: 3; head 1: its three misses and 11, 12
  const SparseWorld::HeadState s = world_.Read(0, 0);
  EXPECT_THAT(s.slot_state,
              ElementsAre(kSlotReady, kSlotLoading, kSlotReady, kSlotReady, kSlotReady));
  for (int32_t j : {2, 3, 4}) {
    EXPECT_EQ(0, std::memcmp(world_.device_pool().page(Slot(j)),
                             world_.host_pool().page(world_.host_page(0, 0, s.slot_page[j])),
                             world_.host_pool().page_bytes()))
        << "slot " << j;
  }
  // The next step finds them resident: 3 is a hit now.
  const Outcome next = Resolve(/*defer=*/false, /*stage_ranked=*/false, /*step=*/3);
  EXPECT_EQ(next.counters[kCounterHit], 2);   // 3 and 7
  EXPECT_EQ(next.counters[kCounterLate], 1);  // 9, whose copy never came
}

TEST_F(SelectTest, StagingForThisStepStampsThePagesAsUsedNow) {
  // kStage, urgent (cross_layer): the top C pages for this step, stamped as used.
  DeviceData& d = world_.data();
  SparseRowPlan row = world_.Row(60, 2);
  const auto rows = d.Put(std::vector<SparseRowPlan>{row});
  SparseScoreArgs score;
  score.rows = rows;
  score.num_heads = 4;
  score.num_kv_heads = 2;
  score.max_candidates = row.candidates;
  score.summaries = index_->summaries();
  score.host_pool = world_.host_pool();
  score.scores = d.Zeros<float>(2 * row.candidates);
  const DeviceSpan<const float> q = d.Put(Query());
  backend_.ScorePages(Mat(const_cast<float*>(q.data()), 1, 128), score);
  SparseSelectArgs a;
  a.rows = rows;
  a.num_kv_heads = 2;
  a.page_size = 4;
  a.mode = SelectMode::kStage;
  a.max_cache_slots = 5;
  a.urgent = true;
  a.scores = score.scores;
  a.device_pool = world_.device_pool();
  a.host_pool = world_.host_pool();
  a.staging.copy_stride = 5;
  a.staging.copies = d.Zeros<PageGatherEntry>(10);
  a.staging.copy_count = d.Zeros<int32_t>(2);
  a.counters = d.Zeros<int64_t>(2 * kSparseCounterCount);
  backend_.SelectPages(a);
  const SparseWorld::HeadState s = world_.Read(0, 0);
  // 3, 7, 9, 11, 12 wanted: 7 and 9 mapped already; 3 and 11 into the free slots, 12 over page 5.
  EXPECT_THAT(s.slot_page, ElementsAre(7, 9, 12, 3, 11));
  for (int j : {2, 3, 4}) EXPECT_EQ(s.slot_stamp[j], UseStamp(2)) << j;
  EXPECT_EQ(d.Get(a.staging.copy_count)[0], 3);
}

TEST_F(SelectTest, LoadingNowCopiesCandidatesAtOnce) {
  // At decode start when the budget covers the candidates: each copied now and ready (here C = 5
  // of 13 fit; the planner calls it only when all do). Head 1 starts empty.
  DeviceData& d = world_.data();
  SparseSelectArgs a;
  a.rows = d.Put(std::vector<SparseRowPlan>{world_.Row(60, 0)});
  a.num_kv_heads = 2;
  a.page_size = 4;
  a.mode = SelectMode::kLoadNow;
  a.max_cache_slots = 5;
  a.device_pool = world_.device_pool();
  a.host_pool = world_.host_pool();
  a.counters = d.Zeros<int64_t>(2 * kSparseCounterCount);
  backend_.SelectPages(a);
  const SparseWorld::HeadState h1 = world_.Read(0, 1);
  EXPECT_THAT(h1.slot_page, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(h1.slot_state, ::testing::Each(kSlotReady));
  EXPECT_EQ(0, std::memcmp(world_.device_pool().page(Slot(0, 1)),
                           world_.host_pool().page(world_.host_page(0, 1, 1)),
                           world_.host_pool().page_bytes()));
  EXPECT_EQ(d.Get(a.counters)[kSparseCounterCount + kCounterFetched], 5);
}

TEST_F(SelectTest, RetiringAWindowPageMovesItToASlotTheLastStepDidNotUse) {
  DeviceData& d = world_.data();
  // Page 13's ring slot holds its tokens (written by decode); it leaves the window at step 3.
  std::vector<float> page13(world_.host_pool().page_elems(), 13.0f);
  backend_.CopyToDevice(world_.device_pool().page(Ring(13)), page13.data(),
                        page13.size() * sizeof(float));
  // Every cache slot taken: two used at step 2 (protected), the others older.
  SetSlot(0, 0, 7, kSlotReady, UseStamp(2));
  SetSlot(0, 1, 9, kSlotReady, UseStamp(2));
  SetSlot(0, 2, 5, kSlotReady, UseStamp(1));
  SetSlot(0, 3, 4, kSlotReady, PredictStamp(1));
  SetSlot(0, 4, 6, kSlotLoading, PredictStamp(1));
  SparseRowPlan row = world_.Row(56, 3);
  row.retire_begin = 13;
  row.retire_end = 14;
  backend_.RetireWindowPages(
      SparseRetireArgs{d.Put(std::vector<SparseRowPlan>{row}), 0, 2, 5, world_.device_pool()});
  const SparseWorld::HeadState s = world_.Read(0, 0);
  // The least recent ready slot is 3 (page 4); slot 4 is loading and may not be taken.
  EXPECT_THAT(s.slot_page, ElementsAre(7, 9, 5, 13, 6));
  EXPECT_EQ(s.slot_state[3], kSlotReady);
  EXPECT_EQ(s.page_slot[4], -1);
  EXPECT_EQ(0, std::memcmp(world_.device_pool().page(Slot(3)), page13.data(),
                           world_.host_pool().page_bytes()));
}

TEST_F(SelectTest, CompletingAPageWritesItBackAndSummarizesIt) {
  DeviceData& d = world_.data();
  // Page 15's ring slot, now full: keys along channel 20 with a spread.
  std::vector<float> page(world_.host_pool().page_elems(), 0.0f);
  for (int t = 0; t < 4; ++t) page[t * 32 + 20] = static_cast<float>(t) - 1.0f;
  backend_.CopyToDevice(world_.device_pool().page(Ring(15)), page.data(), page.size() * 4);
  SparseRowPlan row = world_.Row(63, 3);
  ASSERT_TRUE(row.completes_page);
  SparseCompleteArgs a{d.Put(std::vector<SparseRowPlan>{row}),
                       0,
                       2,
                       world_.device_pool(),
                       world_.host_pool(),
                       index_->summaries()};
  backend_.CompletePages(a);
  const int32_t host = world_.host_page(0, 0, 15);
  EXPECT_EQ(0, std::memcmp(world_.host_pool().page(host), page.data(), page.size() * 4));
  std::vector<float> summary(64);
  backend_.CopyToHost(summary.data(), index_->summaries() + static_cast<size_t>(host) * 64,
                      64 * sizeof(float));
  EXPECT_EQ(summary[20], -1.0f);      // min of channel 20
  EXPECT_EQ(summary[32 + 20], 2.0f);  // max
}

// What a GPU would fault on, the CPU backend refuses: a host vector as an operation's metadata.
TEST(SparseOpsDeathTest, AHostPointerIsNotBackendMemory) {
  CpuBackend backend(1);
  std::vector<int32_t> ids = {1, 2};
  std::vector<float> table(64);
  const DeviceSpan<const int32_t> host_ids(ids.data(), ids.size());
  EXPECT_DEATH(
      backend.SummarizePages(PageSummaryArgs{host_ids, host_ids, PagePoolView{}, table.data()}),
      "not backend memory");
  // Pinned host memory is not metadata's place either (the plan's staging buffer is pinned).
  auto pinned = backend.AllocatePinnedHost(64).value();
  const DeviceSpan<const int32_t> staged(pinned.as<int32_t>(), 2);
  EXPECT_DEATH(
      backend.SummarizePages(PageSummaryArgs{staged, staged, PagePoolView{}, table.data()}),
      "not backend memory");
}

}  // namespace
}  // namespace specula
