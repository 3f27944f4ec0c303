// The CUDA kernels of the sparse KV cache (kernels/sparse.cu) against the CPU reference
// (engine/cpu/cpu_sparse_ops.cc): the same sequence state built on both backends, the same
// operations run on each, and the results compared: scores within float summation tolerance,
// selections, attend lists, slot states and staged copies exactly (the scenarios keep scores
// apart, so no near-tie can rank differently). Skips without a GPU.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend_factory.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/kv/selection_index.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_backend.h"
#include "tests/engine/cpu/device_data.h"
#include "tests/engine/cpu/sparse_world.h"

namespace specula {
namespace {

using ::specula::testing::DeviceData;
using ::specula::testing::SparseWorld;
using ::specula::testing::WorldShape;

// One world per backend, filled alike: page p of head h has its keys along channel (p + h) %
// head_dim with magnitude 10 + p, so selections differ per head and scores never tie.
class TwinWorlds {
 public:
  TwinWorlds(Backend& gpu, const WorldShape& shape, DType dtype) {
    WorldShape s = shape;
    s.dtype = dtype;
    backends_[0] = &cpu_;
    backends_[1] = &gpu;
    for (int i = 0; i < 2; ++i) {
      worlds_[i] = std::make_unique<SparseWorld>(*backends_[i], s);
      worlds_[i]->FillHost(s.tokens, [&](int32_t, int32_t h, int32_t pos, int32_t c) {
        const int32_t page = pos / s.page_size;
        return c == (page + h) % s.head_dim ? 10.0f + page : 0.01f * (pos % 7);
      });
      index_[i] = SelectionIndex::Create("quest", *backends_[i],
                                         worlds_[i]->store().capacity_pages(), s.head_dim)
                      .value();
      std::vector<int32_t> ids;
      for (int32_t h = 0; h < s.kv_heads; ++h) {
        for (int32_t p = 0; p < s.tokens / s.page_size; ++p) {
          ids.push_back(worlds_[i]->host_page(0, h, p));
        }
      }
      backends_[i]->SummarizePages(
          PageSummaryArgs{worlds_[i]->data().Put(ids), worlds_[i]->data().Put(ids),
                          worlds_[i]->host_pool(), index_[i]->summaries()});
    }
  }
  SparseWorld& world(int i) { return *worlds_[i]; }
  Backend& backend(int i) { return *backends_[i]; }
  SelectionIndex& index(int i) { return *index_[i]; }

 private:
  CpuBackend cpu_{2};
  Backend* backends_[2];
  std::unique_ptr<SparseWorld> worlds_[2];
  std::unique_ptr<SelectionIndex> index_[2];
};

class CudaSparseOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto gpu = testing::CreateCudaBackend();
    if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status();
    gpu_ = std::move(*gpu);
  }
  static WorldShape Shape() {
    WorldShape s;
    s.kv_heads = 2;
    s.heads = 8;
    s.head_dim = 64;
    s.page_size = 16;
    s.sink_pages = 1;
    s.window_pages = 2;
    s.budget_pages = 6;
    s.cache_slots = 9;
    s.tokens = 16 * 40;
    return s;
  }
  std::unique_ptr<Backend> gpu_;
};

// Everything one resolve produces, read back in backend-independent form (copies as page
// indices of their pools).
struct Resolved {
  std::vector<float> scores;
  std::vector<int32_t> list_pages, list_tokens, list_count, copy_count;
  std::vector<std::pair<int64_t, int64_t>> copies;  // (host page, device page)
  std::vector<int64_t> counters;
  std::vector<int32_t> slot_page[2], slot_state[2], page_slot[2];
  std::vector<uint32_t> slot_stamp[2];
};

Resolved RunResolve(SparseWorld& w, SelectionIndex& index, const std::vector<float>& queries,
                    SelectMode mode, bool stage_ranked, bool defer, int32_t correct_pages = 0) {
  Backend& b = w.backend();
  DeviceData& d = w.data();
  const WorldShape& s = w.shape();
  SparseRowPlan row = w.Row(s.tokens - 8, 3);  // mid-page: a partial current page
  row.list_capacity = w.ws().geometry().list_capacity();
  row.correct_pages = correct_pages;
  const auto rows = d.Put(std::vector<SparseRowPlan>{row});
  const DeviceSpan<const float> q = d.Put(queries);
  SparseScoreArgs score;
  score.rows = rows;
  score.num_heads = s.heads;
  score.num_kv_heads = s.kv_heads;
  score.max_candidates = row.candidates;
  score.summaries = index.summaries();
  score.host_pool = w.host_pool();
  score.scores = d.Zeros<float>(s.kv_heads * row.candidates);
  b.ScorePages(Mat(const_cast<float*>(q.data()), 1, static_cast<int64_t>(queries.size())), score);
  SparseSelectArgs a;
  a.rows = rows;
  a.num_kv_heads = s.kv_heads;
  a.page_size = s.page_size;
  a.mode = mode;
  a.max_cache_slots = s.cache_slots;
  a.stage_ranked = stage_ranked;
  a.defer_missing = defer;
  a.scores = score.scores;
  a.device_pool = w.device_pool();
  a.host_pool = w.host_pool();
  a.list_pages = d.Zeros<int32_t>(s.kv_heads * row.list_capacity);
  a.list_tokens = d.Zeros<int32_t>(s.kv_heads * row.list_capacity);
  a.list_count = d.Zeros<int32_t>(s.kv_heads);
  a.staging.copy_stride = s.cache_slots;
  a.staging.copies = d.Zeros<PageGatherEntry>(s.kv_heads * s.cache_slots);
  a.staging.copy_count = d.Zeros<int32_t>(s.kv_heads);
  a.counters = d.Zeros<int64_t>(s.kv_heads * kSparseCounterCount);
  b.SelectPages(a);
  Resolved r;
  r.scores = d.Get(score.scores);
  r.list_pages = d.Get(a.list_pages);
  r.list_tokens = d.Get(a.list_tokens);
  r.list_count = d.Get(a.list_count);
  r.copy_count = d.Get(a.staging.copy_count);
  r.counters = d.Get(a.counters);
  const std::vector<PageGatherEntry> copies = d.Get(a.staging.copies);
  for (int32_t h = 0; h < s.kv_heads; ++h) {
    for (int32_t e = 0; e < r.copy_count[h]; ++e) {
      const PageGatherEntry& c = copies[h * s.cache_slots + e];
      const int64_t bytes = static_cast<int64_t>(w.host_pool().page_bytes());
      r.copies.emplace_back(
          (static_cast<const char*>(c.src) - static_cast<const char*>(w.host_pool().base)) / bytes,
          (static_cast<char*>(c.dst) - static_cast<char*>(w.device_pool().base)) / bytes);
    }
  }
  for (int32_t h = 0; h < s.kv_heads; ++h) {
    const SparseWorld::HeadState hs = w.Read(0, h);
    r.slot_page[h] = hs.slot_page;
    r.slot_state[h] = hs.slot_state;
    r.slot_stamp[h] = hs.slot_stamp;
    r.page_slot[h] = hs.page_slot;
  }
  return r;
}

// Queries for both KV heads' groups: head h's group points at pages `pages` (through channel
// (p + h) % head_dim), with decreasing weights.
std::vector<float> Queries(const WorldShape& s, const std::vector<int32_t>& pages) {
  std::vector<float> q(static_cast<size_t>(s.heads) * s.head_dim, 0.0f);
  const int32_t group = s.heads / s.kv_heads;
  for (int32_t qh = 0; qh < s.heads; ++qh) {
    const int32_t kv = qh / group;
    for (size_t i = 0; i < pages.size(); ++i) {
      q[qh * s.head_dim + (pages[i] + kv) % s.head_dim] = 1.0f - 0.05f * static_cast<float>(i);
    }
  }
  return q;
}

void ExpectSame(const Resolved& cpu, const Resolved& gpu, const std::string& what) {
  ASSERT_EQ(cpu.scores.size(), gpu.scores.size());
  for (size_t i = 0; i < cpu.scores.size(); ++i) {
    EXPECT_NEAR(gpu.scores[i], cpu.scores[i], 1e-4 * (1 + std::abs(cpu.scores[i])))
        << what << " score " << i;
  }
  EXPECT_EQ(gpu.list_count, cpu.list_count) << what;
  for (size_t h = 0; h < cpu.list_count.size(); ++h) {
    const int32_t cap = static_cast<int32_t>(cpu.list_pages.size() / cpu.list_count.size());
    for (int32_t e = 0; e < cpu.list_count[h]; ++e) {
      EXPECT_EQ(gpu.list_pages[h * cap + e], cpu.list_pages[h * cap + e]) << what << " " << e;
      EXPECT_EQ(gpu.list_tokens[h * cap + e], cpu.list_tokens[h * cap + e]) << what << " " << e;
    }
  }
  EXPECT_EQ(gpu.copy_count, cpu.copy_count) << what;
  EXPECT_EQ(gpu.copies, cpu.copies) << what;
  EXPECT_EQ(gpu.counters, cpu.counters) << what;
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(gpu.slot_page[h], cpu.slot_page[h]) << what << " head " << h;
    EXPECT_EQ(gpu.slot_state[h], cpu.slot_state[h]) << what << " head " << h;
    EXPECT_EQ(gpu.slot_stamp[h], cpu.slot_stamp[h]) << what << " head " << h;
    EXPECT_EQ(gpu.page_slot[h], cpu.page_slot[h]) << what << " head " << h;
  }
}

TEST_P(CudaSparseOpsTest, ResolveMatchesTheCpu) {
  // fetch; defer; defer correcting the best two of each selection's misses.
  const std::pair<bool, int32_t> policies[] = {{false, 0}, {true, 0}, {true, 2}};
  for (const auto& [defer, correct] : policies) {
    for (bool ranked : {false, true}) {
      TwinWorlds twins(*gpu_, Shape(), GetParam());
      // Some slots mapped beforehand: ready, loading (a copy in flight), ready but unneeded.
      for (int i = 0; i < 2; ++i) {
        twins.world(i).SetSlot(0, 0, 0, 7, kSlotReady, UseStamp(1));
        twins.world(i).SetSlot(0, 0, 1, 9, kSlotLoading, PredictStamp(2));
        twins.world(i).SetSlot(0, 0, 2, 5, kSlotReady, UseStamp(1));
        twins.world(i).SetSlot(0, 1, 4, 20, kSlotReady, UseStamp(2));
      }
      const std::vector<float> q = Queries(Shape(), {3, 7, 9, 12, 20, 21, 30, 31, 2, 4});
      const Resolved cpu = RunResolve(twins.world(0), twins.index(0), q, SelectMode::kResolve,
                                      ranked, defer, correct);
      const Resolved gpu = RunResolve(twins.world(1), twins.index(1), q, SelectMode::kResolve,
                                      ranked, defer, correct);
      ExpectSame(cpu, gpu,
                 std::string("resolve defer=") + (defer ? "1" : "0") +
                     " correct=" + std::to_string(correct) + " ranked=" + (ranked ? "1" : "0"));
      EXPECT_GT(cpu.copies.size(), 0u);  // the scenario does stage pages
    }
  }
}

TEST_P(CudaSparseOpsTest, StageAndLoadNowMatchTheCpu) {
  for (SelectMode mode : {SelectMode::kStage, SelectMode::kLoadNow}) {
    TwinWorlds twins(*gpu_, Shape(), GetParam());
    for (int i = 0; i < 2; ++i) twins.world(i).SetSlot(0, 0, 3, 12, kSlotReady, UseStamp(1));
    const std::vector<float> q = Queries(Shape(), {12, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    const Resolved cpu = RunResolve(twins.world(0), twins.index(0), q, mode, false, false);
    const Resolved gpu = RunResolve(twins.world(1), twins.index(1), q, mode, false, false);
    ExpectSame(cpu, gpu, mode == SelectMode::kStage ? "stage" : "load now");
    if (mode == SelectMode::kLoadNow) {
      // The loaded slots hold the host pages on the GPU too.
      SparseWorld& w = twins.world(1);
      const SparseWorld::HeadState hs = w.Read(0, 1);
      std::vector<char> got(w.host_pool().page_bytes()), want(got.size());
      for (int32_t j = 0; j < Shape().cache_slots; ++j) {
        if (hs.slot_state[j] != kSlotReady) continue;
        gpu_->CopyToHost(got.data(), w.device_pool().page(w.pool_page(w.ws().cache_slot(j), 1)),
                         got.size());
        std::memcpy(want.data(), w.host_pool().page(w.host_page(0, 1, hs.slot_page[j])),
                    want.size());
        EXPECT_EQ(got, want) << "slot " << j;
      }
    }
  }
}

// Many candidates with random, distinct scores: the top-k sets and the staging order (by rank)
// agree with the CPU's, for budgets below, at and above the candidate count.
TEST_P(CudaSparseOpsTest, TopKOfRandomScoresMatchesTheCpu) {
  WorldShape s = Shape();
  s.tokens = 16 * 700;
  s.budget_pages = 64;
  s.cache_slots = 80;
  TwinWorlds twins(*gpu_, s, GetParam());
  std::mt19937 rng(5);
  std::vector<float> q(static_cast<size_t>(s.heads) * s.head_dim);
  for (float& x : q) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  const Resolved cpu =
      RunResolve(twins.world(0), twins.index(0), q, SelectMode::kResolve, true, false);
  const Resolved gpu =
      RunResolve(twins.world(1), twins.index(1), q, SelectMode::kResolve, true, false);
  // Random queries over random keys could make two pages' bounds differ by a rounding error,
  // which would be a legitimate difference: check that none are that close first.
  std::vector<float> sorted = cpu.scores;
  std::sort(sorted.begin(), sorted.end());
  bool close = false;
  for (size_t i = 1; i < sorted.size(); ++i) close |= sorted[i] - sorted[i - 1] < 1e-4f;
  if (close) GTEST_SKIP() << "two scores within rounding of each other";
  ExpectSame(cpu, gpu, "random top-k");
}

// The copy stream's gather, window retirement and page completion, on both backends.
TEST_P(CudaSparseOpsTest, GatherRetireAndCompleteMatchTheCpu) {
  TwinWorlds twins(*gpu_, Shape(), GetParam());
  const std::vector<float> q = Queries(Shape(), {3, 7, 9, 12, 20, 21});
  std::vector<Resolved> resolved;
  for (int i = 0; i < 2; ++i) {
    resolved.push_back(
        RunResolve(twins.world(i), twins.index(i), q, SelectMode::kResolve, true, false));
  }
  std::vector<std::vector<char>> slots(2);
  for (int i = 0; i < 2; ++i) {
    SparseWorld& w = twins.world(i);
    Backend& b = twins.backend(i);
    DeviceData& d = w.data();
    const WorldShape& s = w.shape();
    // Re-stage the same lists (the resolve's staging buffers were read back, not kept): gather
    // what the resolve claimed from its recorded (host page, device page) pairs.
    std::vector<PageGatherEntry> entries;
    std::vector<int32_t> counts(s.kv_heads, 0);
    std::vector<PageGatherEntry> flat(s.kv_heads * s.cache_slots);
    size_t next = 0;
    for (int32_t h = 0; h < s.kv_heads; ++h) {
      for (int32_t e = 0; e < resolved[i].copy_count[h]; ++e, ++next) {
        const auto [host_page, dev_page] = resolved[i].copies[next];
        const int32_t j = [&] {
          for (int32_t k = 0; k < s.cache_slots; ++k) {
            if (w.pool_page(w.ws().cache_slot(k), h) == dev_page) return k;
          }
          return -1;
        }();
        ASSERT_GE(j, 0);
        const int64_t lh = h;
        flat[h * s.cache_slots + counts[h]++] =
            PageGatherEntry{w.host_pool().page(host_page), w.device_pool().page(dev_page),
                            w.ws().device().slot_state + lh * s.cache_slots + j};
      }
    }
    auto stream = b.CreateStream();
    auto gathered = b.AllocatePinnedHost(sizeof(int32_t)).value();
    stream->Wait(b.compute_stream().Record());
    b.GatherPages(*stream, PageGatherArgs{d.Put(flat), d.Put(counts), s.kv_heads, s.cache_slots,
                                          w.host_pool().page_bytes(), gathered.as<int32_t>()});
    stream->Synchronize();
    EXPECT_EQ(*gathered.as<int32_t>(), static_cast<int32_t>(resolved[i].copies.size()));
    // Retire pages 30..36 at the next step (several, some of them mapped already: 30, 31 were
    // staged), then complete page 39.
    SparseRowPlan row = w.Row(16 * 39, 4);
    row.retire_begin = 30;
    row.retire_end = 37;
    b.RetireWindowPages(SparseRetireArgs{d.Put(std::vector<SparseRowPlan>{row}), 0, s.kv_heads,
                                         s.cache_slots, w.device_pool()});
    row = w.Row(16 * 39 + 15, 4);
    b.CompletePages(SparseCompleteArgs{d.Put(std::vector<SparseRowPlan>{row}), 0, s.kv_heads,
                                       w.device_pool(), w.host_pool(), twins.index(i).summaries()});
    const size_t pool_bytes =
        static_cast<size_t>(w.pool().num_blocks()) * s.kv_heads * w.device_pool().page_bytes();
    slots[i].resize(pool_bytes);
    b.CopyToHost(slots[i].data(), w.device_pool().base, pool_bytes);
  }
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(twins.world(1).Read(0, h).slot_state, twins.world(0).Read(0, h).slot_state);
    EXPECT_EQ(twins.world(1).Read(0, h).slot_page, twins.world(0).Read(0, h).slot_page);
  }
  EXPECT_EQ(slots[1], slots[0]);  // every slot's bytes
  // The completed page's host copy (the GPU wrote pinned memory through its mapping).
  const int32_t page = twins.world(0).host_page(0, 0, 39);
  EXPECT_EQ(0, std::memcmp(twins.world(1).host_pool().page(twins.world(1).host_page(0, 0, 39)),
                           twins.world(0).host_pool().page(page),
                           twins.world(0).host_pool().page_bytes()));
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaSparseOpsTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace specula
