// Invariant 4: hit-rate accounting on synthetic query sequences whose needed pages are known.
// Page p of the prompt has every key 10 * e_p, so with the quest selector a query
// 2 * Σ_{needed} e_p + Σ_{hint} e_p scores needed pages 20, hinted pages 10 and the rest 0:
// the top-budget set is exactly `needed`, and the best page below the cut is the hint.
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/kv/sparse_harness.h"

namespace specula {
namespace {

using ::specula::testing::HarnessShape;
using ::specula::testing::SparseHarness;

constexpr int32_t kPromptPages = 51;  // page 0 sink, 1..49 candidates, 50 in the window
constexpr int32_t kPageSize = 4;

void PageKeys(int64_t, int32_t, int32_t, int32_t pos, float* k, float* v) {
  const int32_t page = pos / kPageSize;
  for (int32_t c = 0; c < 64; ++c) {
    k[c] = (page < kPromptPages && c == page) ? 10.0f : 0.0f;  // decode tokens: zero keys
    v[c] = static_cast<float>(page);
  }
}

SparseOptions Options(SpeculationMode mode, int32_t extra_pages,
                      MissPolicy miss = MissPolicy::kFetch) {
  SparseOptions o;
  o.enabled = true;
  o.budget_tokens = 4 * kPageSize;  // 4 pages
  o.sink_tokens = kPageSize;
  o.recent_tokens = kPageSize;
  o.prefetch_extra_tokens = extra_pages * kPageSize;
  o.speculation = mode;
  o.miss_policy = miss;
  o.min_context_tokens = 0;
  o.host_capacity_tokens = 4096;
  return o;
}

std::vector<float> Query(const std::vector<int32_t>& needed, const std::vector<int32_t>& hint,
                         int32_t heads = 2) {
  std::vector<float> q(static_cast<size_t>(heads) * 64, 0.0f);
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t p : needed) q[h * 64 + p] = 2.0f;
    for (int32_t p : hint) q[h * 64 + p] = 1.0f;
  }
  return q;
}

struct SequenceRun {
  KvStats stats;
  std::vector<int64_t> hits_per_step;
};

// Runs `steps` decode steps; step t needs needed(t) and hints hint(t).
template <typename NeededFn, typename HintFn>
SequenceRun RunSequence(const SparseOptions& options, int32_t steps, NeededFn needed, HintFn hint,
                int32_t layers = 1, bool predict_next_layer = false) {
  HarnessShape shape;
  shape.layers = layers;
  shape.page_size = kPageSize;
  SparseHarness h(options, shape, PageKeys);
  auto ws = h.Start(1, kPromptPages * kPageSize, steps, 0);
  h.cache().WaitForPrefetches();
  SequenceRun run;
  int64_t hits_before = 0;
  for (int32_t t = 0; t < steps; ++t) {
    const std::vector<float> q = Query(needed(t), hint(t));
    h.Step({ws.get()}, {q}, [&](int32_t layer) {
      if (predict_next_layer && layer + 1 < layers) {
        // What cross_layer computes from layer l's input; exact here, to test the plumbing.
        SparseRows row{ws.get(), 0, 1, h.position(ws.get()), false};
        h.cache().PredictLayer(layer + 1, absl::MakeConstSpan(&row, 1), q);
        h.cache().WaitForPrefetches();
      }
    });
    // Predictions land before the next step, so the counts do not depend on timing.
    h.cache().WaitForPrefetches();
    const KvStats s = h.cache().Stats(*ws);
    run.hits_per_step.push_back(s.pages_hit - hits_before);
    hits_before = s.pages_hit;
  }
  run.stats = h.cache().Stats(*ws);
  h.Finish(*ws);
  EXPECT_EQ(h.cache().host_pages_used(), 0);
  EXPECT_EQ(h.cache().device_slots_used(), 0);
  EXPECT_EQ(h.pool().used_blocks(), 0);
  return run;
}

std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> r;
  for (int32_t i = 0; i < n; ++i) r.push_back(first + i);
  return r;
}

TEST(HitRateTest, StableSequenceHitsEverythingAfterWarmUp) {
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kNone, 2), 20, [](int32_t) { return std::vector{5, 17, 30, 42}; },
      [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.stats.pages_missed, 4);  // the first step fetches the set once
  EXPECT_EQ(r.stats.pages_hit, 19 * 4);
  EXPECT_EQ(r.stats.bytes_fetched, 4 * 2 * kPageSize * 64 * static_cast<int64_t>(sizeof(float)));
  for (size_t t = 1; t < r.hits_per_step.size(); ++t) EXPECT_EQ(r.hits_per_step[t], 4) << t;
  EXPECT_DOUBLE_EQ(r.stats.hit_rate(), 76.0 / 80.0);
}

TEST(HitRateTest, AdversarialSequenceMissesEverything) {
  // Four pages never seen before at every step, no spare slots, no speculation.
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kNone, 0), 12, [](int32_t t) { return Range(1 + 4 * t, 4); },
      [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.stats.pages_hit, 0);
  EXPECT_EQ(r.stats.pages_missed, 48);
  EXPECT_EQ(r.stats.hit_rate(), 0.0);
  EXPECT_EQ(r.stats.bytes_prefetched, 0);
}

TEST(HitRateTest, SlidingSequenceMissesOneNewPagePerStepWithoutSpeculation) {
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kNone, 2), 20, [](int32_t t) { return Range(10 + t, 4); },
      [](int32_t t) { return std::vector{14 + t}; });
  EXPECT_EQ(r.stats.pages_missed, 4 + 19);
  EXPECT_EQ(r.stats.pages_hit, 19 * 3);
}

TEST(HitRateTest, CrossStepPrefetchesTheNextPage) {
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kCrossStep, 2), 20, [](int32_t t) { return Range(10 + t, 4); },
      [](int32_t t) { return std::vector{14 + t}; });
  EXPECT_EQ(r.stats.pages_missed, 4);  // only the first step, which nothing predicted
  EXPECT_EQ(r.stats.pages_hit, 19 * 4);
  EXPECT_GE(r.stats.bytes_prefetched, 19 * 2 * kPageSize * 64 * static_cast<int64_t>(sizeof(float)));
  for (size_t t = 1; t < r.hits_per_step.size(); ++t) EXPECT_EQ(r.hits_per_step[t], 4) << t;
}

TEST(HitRateTest, CrossStepFromThePromptsLastQueryWarmsTheFirstStep) {
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kCrossStep, 2), shape, PageKeys);
  const std::vector<float> q = Query({7, 8, 9, 20}, {});
  auto ws = h.Start(1, kPromptPages * kPageSize, 4, 0, q);
  h.cache().WaitForPrefetches();
  h.Step({ws.get()}, {q});
  EXPECT_EQ(h.cache().Stats(*ws).pages_hit, 4);
  EXPECT_EQ(h.cache().Stats(*ws).pages_missed, 0);
  h.Finish(*ws);
}

TEST(HitRateTest, SkipPolicyLeavesMissesOutAndStagesThemForLater) {
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kNone, 2, MissPolicy::kSkip), 6,
      [](int32_t) { return std::vector{5, 17, 30, 42}; },
      [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.stats.pages_missed, 4);  // skipped at the first step...
  EXPECT_EQ(r.stats.bytes_fetched, 0);  // ...never fetched synchronously...
  EXPECT_EQ(r.stats.pages_hit, 5 * 4);  // ...and staged in the background for the next
  EXPECT_EQ(r.stats.stall_seconds, 0.0);
}

TEST(HitRateTest, CrossLayerPredictsTheNextLayersPages) {
  // Fresh pages every step: layer 0 misses them all; layer 1, predicted while layer 0 runs,
  // hits them all.
  const auto needed = [](int32_t t) { return Range(1 + 4 * t, 4); };
  const auto none = [](int32_t) { return std::vector<int32_t>{}; };
  const SequenceRun with = RunSequence(Options(SpeculationMode::kCrossLayer, 0), 12, needed, none, 2, true);
  EXPECT_EQ(with.stats.pages_missed, 48);
  EXPECT_EQ(with.stats.pages_hit, 48);
  const SequenceRun without = RunSequence(Options(SpeculationMode::kNone, 0), 12, needed, none, 2, false);
  EXPECT_EQ(without.stats.pages_missed, 96);
  EXPECT_EQ(without.stats.pages_hit, 0);
}

TEST(HitRateTest, FetchingAMissNeverEvictsAPageSelectedInTheSameStep) {
  // Budget 2 pages + 1 spare. Step 3 needs 25 (a miss) and 30 (resident, least recently
  // used): fetching 25 must evict 40, not 30.
  SparseOptions o = Options(SpeculationMode::kNone, 1);
  o.budget_tokens = 2 * kPageSize;
  const std::vector<std::vector<int32_t>> needed = {{10, 30}, {20, 40}, {25, 30}};
  const SequenceRun r = RunSequence(
      o, 3, [&](int32_t t) { return needed[t]; },
      [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.hits_per_step, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(r.stats.pages_missed, 5);
}

TEST(HitRateTest, AttentionReadsExactlyTheSelectedPagesPlusSinksAndWindow) {
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kNone, 2), shape, PageKeys);
  auto ws = h.Start(1, kPromptPages * kPageSize, 4, 0);
  std::vector<int32_t> seen;
  h.cache().set_attention_observer([&](const AttendedPages& a) { seen = a.logical; });
  h.Step({ws.get()}, {Query({30, 5, 42, 17}, {})});
  // Sink 0, the four selected in position order, then the window (50) and the current page.
  EXPECT_EQ(seen, (std::vector<int32_t>{0, 5, 17, 30, 42, 50, 51}));
  h.Finish(*ws);
}

}  // namespace
}  // namespace specula
