// Invariant 4: hit-rate accounting on synthetic query sequences whose needed pages are known.
// Page p of the prompt has every key 10 * e_p, so with the quest selector a query
// 2 * Σ_{needed} e_p + Σ_{hint} e_p scores needed pages 20, hinted pages 10 and the rest 0:
// the top-budget set is exactly `needed`, and the best page below the cut is the hint.
#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/kv/gated_copy_backend.h"
#include "tests/engine/kv/sparse_harness.h"

namespace specula {
namespace {

using ::specula::testing::CopyGate;
using ::specula::testing::GatedCopyBackend;
using ::specula::testing::HarnessShape;
using ::specula::testing::SparseHarness;

constexpr int32_t kPromptPages = 51;  // page 0 sink, 1..49 candidates, 50 in the window
constexpr int32_t kPageSize = 4;
constexpr int64_t kPageBytes = 2 * kPageSize * 64 * static_cast<int64_t>(sizeof(float));

void PageKeys(int64_t, int32_t, int32_t, int32_t pos, float* k, float* v) {
  const int32_t page = pos / kPageSize;
  for (int32_t c = 0; c < 64; ++c) {
    k[c] = (page < kPromptPages && c == page) ? 10.0f : 0.0f;  // decode tokens: zero keys
    v[c] = static_cast<float>(page);
  }
}

SparseOptions Options(SpeculationMode mode, int32_t extra_pages,
                      MissPolicy miss = MissPolicy::kFetch, double miss_correction = 0) {
  SparseOptions o;
  o.enabled = true;
  o.budget_tokens = 4 * kPageSize;  // 4 pages
  o.sink_tokens = kPageSize;
  o.recent_tokens = kPageSize;
  o.prefetch_extra_tokens = extra_pages * kPageSize;
  o.speculation = mode;
  o.miss_policy = miss;
  o.miss_correction = miss_correction;
  o.min_context_tokens = 0;
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
        h.PredictLayer(layer + 1, {q});
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
      Options(SpeculationMode::kNone, 2), 20,
      [](int32_t) {
        return std::vector{5, 17, 30, 42};
      },
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
  // Each missed page was read from the host at use, and loaded into a slot for later (a cache
  // fill that never pays off here).
  EXPECT_EQ(r.stats.bytes_fetched, 48 * kPageBytes);
  EXPECT_EQ(r.stats.bytes_prefetched, 48 * kPageBytes);
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
  EXPECT_GE(r.stats.bytes_prefetched,
            19 * 2 * kPageSize * 64 * static_cast<int64_t>(sizeof(float)));
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

TEST(HitRateTest, DeferLeavesMissesOutAndStagesThemForTheNextStep) {
  const SequenceRun r = RunSequence(
      Options(SpeculationMode::kNone, 2, MissPolicy::kDefer), 6,
      [](int32_t) {
        return std::vector{5, 17, 30, 42};
      },
      [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.stats.pages_missed, 4);   // left out at the first step...
  EXPECT_EQ(r.stats.bytes_fetched, 0);  // ...never fetched synchronously...
  EXPECT_EQ(r.stats.pages_hit, 5 * 4);  // ...and staged in the background for the next
  EXPECT_EQ(r.stats.stall_seconds, 0.0);
}

// Four pages never seen before at every step, all tied at the top: with miss_correction 0.5 of a
// 4-page budget, defer reads the best two (the lower indices) from the host at once and leaves
// the other two out.
TEST(HitRateTest, DeferCorrectsTheBestRankedShareOfItsMisses) {
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kNone, 0, MissPolicy::kDefer, 0.5), shape, PageKeys);
  auto ws = h.Start(1, kPromptPages * kPageSize, 8, 0);
  std::vector<std::vector<int32_t>> attended;
  h.cache().set_attention_observer([&](const AttendedPages& a) {
    if (!a.after) attended.push_back(h.LogicalList(a, 0, 0));
  });
  for (int32_t t = 0; t < 6; ++t) {
    h.Step({ws.get()}, {Query(Range(1 + 4 * t, 4), {})});
    h.cache().WaitForPrefetches();
  }
  const KvStats s = h.cache().Stats(*ws);
  EXPECT_EQ(s.pages_missed, 24);
  EXPECT_EQ(s.pages_corrected, 12);
  EXPECT_EQ(s.bytes_fetched, 12 * kPageBytes);
  ASSERT_EQ(attended.size(), 6u);
  for (int32_t t = 0; t < 6; ++t) {
    // Sink 0, the two corrected misses, the window page and the current one (the fifth step
    // starts page 52).
    EXPECT_EQ(attended[t], (std::vector<int32_t>{0, 1 + 4 * t, 2 + 4 * t, 50 + t / 4, 51 + t / 4}))
        << "step " << t;
  }
  h.Finish(*ws);
}

TEST(HitRateTest, CrossLayerPredictsTheNextLayersPages) {
  // Fresh pages every step: layer 0 misses them all; layer 1, predicted while layer 0 runs,
  // hits them all.
  const auto needed = [](int32_t t) { return Range(1 + 4 * t, 4); };
  const auto none = [](int32_t) { return std::vector<int32_t>{}; };
  const SequenceRun with =
      RunSequence(Options(SpeculationMode::kCrossLayer, 0), 12, needed, none, 2, true);
  EXPECT_EQ(with.stats.pages_missed, 48);
  EXPECT_EQ(with.stats.pages_hit, 48);
  const SequenceRun without =
      RunSequence(Options(SpeculationMode::kNone, 0), 12, needed, none, 2, false);
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
      o, 3, [&](int32_t t) { return needed[t]; }, [](int32_t) { return std::vector<int32_t>{}; });
  EXPECT_EQ(r.hits_per_step, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(r.stats.pages_missed, 5);
}

TEST(HitRateTest, AttentionReadsExactlyTheSelectedPagesPlusSinksAndWindow) {
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kNone, 2), shape, PageKeys);
  auto ws = h.Start(1, kPromptPages * kPageSize, 4, 0);
  std::vector<int32_t> seen;
  h.cache().set_attention_observer([&](const AttendedPages& a) { seen = h.LogicalList(a, 0, 0); });
  h.Step({ws.get()}, {Query({30, 5, 42, 17}, {})});
  // Sink 0, the four selected in position order, then the window (50) and the current page.
  EXPECT_EQ(seen, (std::vector<int32_t>{0, 5, 17, 30, 42, 50, 51}));
  h.Finish(*ws);
}

// A prefetch still copying when attention needs its page is late: neither a hit (its copy had
// not landed) nor a miss (the prediction was right). The sliding sequence with cross_step:
// step t needs pages 10+t..13+t and predicts 14+t for step t+1. The copy of page 16, staged at
// step 2, is held at the gate (the device selection has claimed its slot, so the page is mapped
// and loading) while step 3 needs it.
struct HeldPrefetchRun {
  KvStats stats;  // after step 4
  KvStats after_step3;
  std::vector<int32_t> attended3;  // logical pages step 3's attention read
  std::vector<float> out3;         // step 3's attention output
  int held = 0;                    // copies the gate held
};

HeldPrefetchRun RunWithHeldPrefetch(MissPolicy miss, bool hold) {
  auto backend = std::make_unique<GatedCopyBackend>();
  CopyGate& gate = backend->gate();
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kCrossStep, 2, miss), shape, PageKeys,
                  std::move(backend));
  auto ws = h.Start(1, kPromptPages * kPageSize, 8, 0);
  h.cache().WaitForPrefetches();
  auto step = [&](int32_t t) { h.Step({ws.get()}, {Query(Range(10 + t, 4), {14 + t})}); };
  for (int32_t t = 0; t < 2; ++t) {
    step(t);
    h.cache().WaitForPrefetches();
  }
  // The gate holds step 2's copies (page 16's among them) for at most 300 ms: under defer step 3
  // waits for them, under fetch it reads page 16 from the host store instead.
  if (hold) gate.Close(std::chrono::milliseconds(300));
  step(2);
  if (hold) {
    EXPECT_TRUE(gate.WaitForHeld(1, std::chrono::seconds(30)));
  } else {
    h.cache().WaitForPrefetches();  // on time: page 16 lands before step 3
  }
  HeldPrefetchRun run;
  h.cache().set_attention_observer([&](const AttendedPages& a) {
    if (!a.after) run.attended3 = h.LogicalList(a, 0, 0);
  });
  step(3);
  h.cache().set_attention_observer(nullptr);
  run.after_step3 = h.cache().Stats(*ws);
  run.out3 = h.last_out();
  gate.Open();
  h.cache().WaitForPrefetches();
  step(4);
  h.cache().WaitForPrefetches();
  run.stats = h.cache().Stats(*ws);
  run.held = gate.held();
  h.Finish(*ws);
  EXPECT_EQ(h.cache().host_pages_used(), 0);
  EXPECT_EQ(h.pool().used_blocks(), 0);
  return run;
}

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(HitRateTest, APrefetchStillCopyingIsLateAndFetchReadsItFromTheHostWithTheSameOutput) {
  const HeldPrefetchRun on_time = RunWithHeldPrefetch(MissPolicy::kFetch, /*hold=*/false);
  EXPECT_EQ(on_time.stats.pages_late, 0);
  EXPECT_EQ(on_time.stats.pages_hit, 4 * 4);
  EXPECT_EQ(on_time.stats.pages_missed, 4);  // step 0, which nothing predicted

  const HeldPrefetchRun late = RunWithHeldPrefetch(MissPolicy::kFetch, /*hold=*/true);
  EXPECT_GE(late.held, 1);
  EXPECT_EQ(late.after_step3.pages_late, 1);  // page 16 at step 3
  EXPECT_EQ(late.stats.pages_late, 1);
  EXPECT_EQ(late.stats.pages_hit, 4 * 4 - 1);
  EXPECT_EQ(late.stats.pages_missed, 4);
  EXPECT_DOUBLE_EQ(late.stats.hit_rate(), 15.0 / 20.0);
  // fetch read the late page from the host store instead of waiting for its copy (one page
  // more read at use), and attended it...
  EXPECT_TRUE(Contains(late.attended3, 16));
  EXPECT_EQ(late.stats.bytes_fetched, on_time.stats.bytes_fetched + kPageBytes);
  EXPECT_EQ(late.after_step3.stall_seconds, 0.0);  // attention never waits for a copy
  // ...so the output is exactly the on-time run's.
  EXPECT_EQ(late.out3, on_time.out3);
}

// Under defer, step 3 waits for the copy staged at step 2 before it selects (a stall), finds
// page 16 resident and attends exactly what the on-time run attends.
TEST(HitRateTest, DeferWaitsForAnEarlierStepsCopyAndAttendsAsIfItWereOnTime) {
  const HeldPrefetchRun on_time = RunWithHeldPrefetch(MissPolicy::kDefer, /*hold=*/false);
  const HeldPrefetchRun late = RunWithHeldPrefetch(MissPolicy::kDefer, /*hold=*/true);
  EXPECT_GE(late.held, 1);
  EXPECT_GT(late.after_step3.stall_seconds, 0.0);  // it waited for the held copy...
  EXPECT_EQ(on_time.after_step3.stall_seconds, 0.0);
  EXPECT_TRUE(Contains(late.attended3, 16));  // ...and then attended page 16 from its slot
  EXPECT_EQ(late.attended3, on_time.attended3);
  EXPECT_EQ(late.out3, on_time.out3);
  EXPECT_EQ(late.stats.pages_late, 0);  // landed before its layer selected: a hit
  EXPECT_EQ(late.stats.pages_hit, on_time.stats.pages_hit);
  EXPECT_EQ(late.stats.pages_missed, 4);   // step 0, which nothing predicted...
  EXPECT_EQ(late.stats.bytes_fetched, 0);  // ...left out, never read from the host
}

// Under defer, a page staged in this step (cross_layer, for the next layer) whose copy is in
// flight when that layer selects it is late: attention waits for it and reads it from its slot,
// with the output of a run whose copy was on time. Layer 0 never predicts anything: every page
// it selects is a miss, left out.
struct CrossLayerRun {
  KvStats stats;
  std::vector<int32_t> attended;  // layer 1's logical pages
  std::vector<float> out;
};

CrossLayerRun RunWithHeldPrediction(bool hold) {
  auto backend = std::make_unique<GatedCopyBackend>();
  CopyGate& gate = backend->gate();
  HarnessShape shape;
  shape.layers = 2;
  shape.page_size = kPageSize;
  SparseHarness h(Options(SpeculationMode::kCrossLayer, 0, MissPolicy::kDefer), shape, PageKeys,
                  std::move(backend));
  auto ws = h.Start(1, kPromptPages * kPageSize, 4, 0);
  h.cache().WaitForPrefetches();
  CrossLayerRun run;
  h.cache().set_attention_observer([&](const AttendedPages& a) {
    if (a.layer == 1 && !a.after) run.attended = h.LogicalList(a, 0, 0);
  });
  const std::vector<float> q = Query({6, 19, 33, 47}, {});
  h.Step({ws.get()}, {q}, [&](int32_t layer) {
    if (layer != 0) return;
    if (hold) gate.Close(std::chrono::milliseconds(300));
    h.PredictLayer(1, {q});
    if (hold) {
      EXPECT_TRUE(gate.WaitForHeld(1, std::chrono::seconds(30)));
    }
  });
  h.cache().set_attention_observer(nullptr);
  run.out = h.last_out();
  gate.Open();
  h.cache().WaitForPrefetches();
  run.stats = h.cache().Stats(*ws);
  h.Finish(*ws);
  return run;
}

TEST(HitRateTest, DeferWaitsForALateCrossLayerPageAndCountsIt) {
  const CrossLayerRun on_time = RunWithHeldPrediction(/*hold=*/false);
  const CrossLayerRun late = RunWithHeldPrediction(/*hold=*/true);
  EXPECT_EQ(late.stats.pages_late, 4);  // layer 1's four, still loading when it selected them
  EXPECT_GT(late.stats.stall_seconds, 0.0);
  EXPECT_EQ(late.stats.pages_missed, 4);  // layer 0's, left out
  EXPECT_EQ(late.stats.bytes_fetched, 0);
  EXPECT_EQ(late.attended, (std::vector<int32_t>{0, 6, 19, 33, 47, 50, 51}));
  EXPECT_EQ(late.attended, on_time.attended);
  EXPECT_EQ(late.out, on_time.out);
  EXPECT_EQ(on_time.stats.pages_late + on_time.stats.pages_hit, 4);
}

}  // namespace
}  // namespace specula
