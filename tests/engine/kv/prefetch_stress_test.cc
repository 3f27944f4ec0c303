// Invariant 2 under load: the prefetch executor's copy streams (their own threads on the CPU
// backend) load staged pages while the compute stream selects, attends, moves the window,
// admits and releases sequences. Every key and value is a
// checksum of (sequence, layer, head, position, channel), and before every attention the test
// checks that each page attention reads holds exactly the K/V of the position it stands for.
// A copy landing in a slot being read, or a stale copy landing in a slot reused by another
// sequence, breaks a checksum; ThreadSanitizer (the *_tsan build of this test) reports any
// unsynchronized access on top.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/kv/sparse_harness.h"

namespace specula {
namespace {

using ::specula::testing::HarnessShape;
using ::specula::testing::SparseHarness;

float Checksum(int64_t tag, int32_t layer, int32_t head, int32_t pos, int32_t c, int32_t kv) {
  uint64_t x = static_cast<uint64_t>(tag) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(layer) << 48) ^ (static_cast<uint64_t>(head) << 40) ^
               (static_cast<uint64_t>(pos) << 8) ^ (static_cast<uint64_t>(c) << 1) ^ kv;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<float>(x % 20001) / 10000.0f - 1.0f;  // [-1, 1]
}

void ChecksumKv(int64_t tag, int32_t layer, int32_t head, int32_t pos, float* k, float* v) {
  for (int32_t c = 0; c < 16; ++c) {
    k[c] = Checksum(tag, layer, head, pos, c, 0);
    v[c] = Checksum(tag, layer, head, pos, c, 1);
  }
}

struct StressConfig {
  SpeculationMode speculation;
  MissPolicy miss;
  int32_t steps;
  double miss_correction = 0;  // defer: 0 never reads the host store at use
};

// Runs `steps` steps of up to four sequences that come and go at random (the same ones for the
// same `seed`), each step with random queries and, at random, cross_layer predictions; appends
// each step's attention output to `outputs` when given.
void DriveRandomDecode(SparseHarness& h, int32_t steps, uint32_t seed = 1234,
                       std::vector<std::vector<float>>* outputs = nullptr) {
  const HarnessShape& shape = h.shape();
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::shared_ptr<WorkingSet>> live;
  std::vector<int32_t> remaining;  // decode steps each live sequence may still run
  int64_t next_tag = 1;
  auto random_query = [&] {
    std::vector<float> q(shape.heads * shape.head_dim);
    for (float& x : q) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    return q;
  };
  for (int32_t step = 0; step < steps; ++step) {
    if (live.size() < 4 && uniform(0, 3) == 0) {
      const int32_t prompt = uniform(3, 90), max_new = uniform(1, 40);
      live.push_back(h.Start(next_tag++, prompt, max_new, 0, random_query()));
      remaining.push_back(max_new);
    }
    if (live.empty()) continue;
    std::vector<WorkingSet*> seqs;
    std::vector<std::vector<float>> queries;
    for (auto& ws : live) {
      seqs.push_back(ws.get());
      queries.push_back(random_query());
    }
    h.Step(seqs, queries, [&](int32_t layer) {
      if (layer + 1 < shape.layers && uniform(0, 1) == 0) {
        // Predictions for the next layer, right or wrong, racing with this layer's work.
        std::vector<std::vector<float>> early;
        for (size_t i = 0; i < seqs.size(); ++i) early.push_back(random_query());
        h.PredictLayer(layer + 1, early);
      }
    });
    if (outputs != nullptr) outputs->push_back(h.last_out());
    for (size_t i = 0; i < live.size();) {
      // Finish or cancel at random, with prefetches possibly in flight.
      if (--remaining[i] == 0 || uniform(0, 30) == 0) {
        h.Finish(*live[i]);
        live.erase(live.begin() + i);
        remaining.erase(remaining.begin() + i);
      } else {
        ++i;
      }
    }
  }
  for (auto& ws : live) h.Finish(*ws);
}

class PrefetchStressTest : public ::testing::TestWithParam<StressConfig> {};

// The state of the cache slot whose pool page is `pool_page`, or kSlotReady for a sink or
// window slot (written on the compute stream, never loading).
int32_t CacheSlotState(const WorkingSet& ws, int32_t layer, int32_t head, int32_t pool_page) {
  SparseRowPlan row;
  row.seq = ws.device();
  const SparseHead h(row, layer, head, ws.geometry().kv_heads);
  for (int32_t j = 0; j < row.seq.cache_slots; ++j) {
    if (h.PoolPage(h.CacheSlot(j)) == pool_page) {
      return std::atomic_ref<int32_t>(h.state[j]).load(std::memory_order_acquire);
    }
  }
  return kSlotReady;
}

SparseOptions StressOptions(const StressConfig& cfg) {
  SparseOptions o;
  o.enabled = true;
  o.budget_tokens = 12;  // 3 pages of 4
  o.sink_tokens = 4;
  o.recent_tokens = 4;
  o.prefetch_extra_tokens = 8;
  o.speculation = cfg.speculation;
  o.miss_policy = cfg.miss;
  o.miss_correction = cfg.miss_correction;
  o.min_context_tokens = 0;
  o.prefetch_threads = 3;
  return o;
}

HarnessShape StressShape() {
  HarnessShape shape;
  shape.layers = 2;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.page_size = 4;
  shape.device_blocks = 256;
  shape.host_tokens = 2048;
  return shape;
}

TEST_P(PrefetchStressTest, PagesReadAlwaysHoldTheirPositions) {
  const StressConfig cfg = GetParam();
  const HarnessShape shape = StressShape();
  SparseHarness h(StressOptions(cfg), shape, ChecksumKv);

  int64_t checked_pages = 0, device_pages = 0;
  std::vector<float> want_k(16), want_v(16);
  // Before and after each attention: a copy landing while it reads would show on one side.
  h.cache().set_attention_observer([&](const AttendedPages& a) {
    const KvLayerView dev = h.pool().Layer(a.layer);
    for (size_t row = 0; row < a.rows.size(); ++row) {
      const WorkingSetGeometry& g = a.rows[row]->geometry();
      const int32_t pos = h.position(a.rows[row]);
      const int32_t current = pos / shape.page_size;
      const int32_t candidates = std::max(0, current - g.window_pages - g.sink_pages);
      const int32_t expected =
          std::min(g.sink_pages, current + 1) + std::min(g.budget_pages, candidates) +
          std::max(0, current + 1 - std::max(g.sink_pages, current - g.window_pages));
      for (int32_t head = 0; head < shape.kv_heads; ++head) {
        const size_t list = row * shape.kv_heads + head;
        const int32_t attended = a.list_count[list];
        // Sinks + the budget's pages + the window; `defer` leaves pages without a slot out.
        if (cfg.miss == MissPolicy::kFetch) {
          ASSERT_EQ(attended, expected) << "position " << pos;
        } else {
          ASSERT_LE(attended, expected) << "position " << pos;
        }
        const std::vector<int32_t> logical = h.LogicalList(a, static_cast<int32_t>(row), head);
        for (size_t e = 1; e < logical.size(); ++e) {
          ASSERT_LT(logical[e - 1], logical[e]) << "pages not in position order";
        }
        for (int32_t i = 0; i < attended; ++i) {
          const int32_t e = a.list_begin[list] + i;
          // A device slot, or (fetch) the host store's page.
          const int32_t ref = a.pages[e];
          if (cfg.miss == MissPolicy::kDefer && cfg.miss_correction == 0) {
            ASSERT_FALSE(IsHostPageRef(ref)) << "defer read the host store at use";
          }
          if (cfg.miss == MissPolicy::kDefer && !IsHostPageRef(ref)) {
            ASSERT_EQ(CacheSlotState(*a.rows[row], a.layer, head, ref), kSlotReady)
                << "attention read a cache slot whose copy had not landed";
          }
          const float* page =
              IsHostPageRef(ref)
                  ? static_cast<const float*>(h.cache().store().Page(HostPageOf(ref)))
                  : static_cast<const float*>(dev.base) +
                        static_cast<size_t>(ref) * dev.page_elems();
          for (int32_t t = 0; t < a.tokens[e]; ++t) {
            const int32_t pos = logical[i] * shape.page_size + t;
            h.Expected(a.rows[row], a.layer, head, pos, want_k.data(), want_v.data());
            ASSERT_EQ(0, std::memcmp(page + t * 16, want_k.data(), 16 * sizeof(float)))
                << "K of position " << pos << " layer " << a.layer << " head " << head;
            ASSERT_EQ(0, std::memcmp(page + (shape.page_size + t) * 16, want_v.data(),
                                     16 * sizeof(float)))
                << "V of position " << pos;
          }
          ++checked_pages;
          if (!IsHostPageRef(ref)) ++device_pages;
        }
      }
    }
  });

  DriveRandomDecode(h, cfg.steps);
  EXPECT_GT(checked_pages, 1000);
  EXPECT_GT(device_pages, 1000);  // mostly slots, not only the host store
  EXPECT_EQ(h.cache().host_pages_used(), 0);
  EXPECT_EQ(h.cache().device_slots_used(), 0);
  EXPECT_EQ(h.pool().used_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PrefetchStressTest,
    ::testing::Values(StressConfig{SpeculationMode::kBoth, MissPolicy::kFetch, 2000},
                      StressConfig{SpeculationMode::kBoth, MissPolicy::kDefer, 2000},
                      StressConfig{SpeculationMode::kBoth, MissPolicy::kDefer, 2000, 0.5},
                      StressConfig{SpeculationMode::kCrossStep, MissPolicy::kFetch, 2000}),
    [](const ::testing::TestParamInfo<StressConfig>& info) {
      return std::string(SpeculationModeName(info.param.speculation)) + "_" +
             MissPolicyName(info.param.miss) + (info.param.miss_correction > 0 ? "_corrected" : "");
    });

// Copy streams that sleep before every other batched copy: prefetches land late and at
// uneven times.
class SlowCopyBackend : public CpuBackend {
 public:
  SlowCopyBackend() : CpuBackend(1) {}
  std::unique_ptr<Stream> CreateStream() override {
    return MakeCopyStream([n = std::make_shared<std::atomic<int>>(0)] {
      if (n->fetch_add(1) % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
};

// Under defer what a step attends may not depend on when copies land: the same random run with
// copies that land late gives every step's attention output bit for bit. (Under fetch this holds
// too, by reading late pages from the host store; the old policy `skip` failed it.) With and
// without corrections, which depend on the ranking alone.
TEST(PrefetchDeterminismTest, DeferAttendsTheSameWhateverTheCopiesTiming) {
  const StressConfig configs[] = {{SpeculationMode::kBoth, MissPolicy::kDefer, 300, 0},
                                  {SpeculationMode::kCrossStep, MissPolicy::kDefer, 300, 0},
                                  {SpeculationMode::kBoth, MissPolicy::kDefer, 300, 0.5}};
  for (const StressConfig& cfg : configs) {
    const std::string what = std::string(SpeculationModeName(cfg.speculation)) + " correction " +
                             std::to_string(cfg.miss_correction);
    auto run = [&](std::unique_ptr<CpuBackend> backend, double* stall) {
      SparseHarness h(StressOptions(cfg), StressShape(), ChecksumKv, std::move(backend));
      std::vector<std::vector<float>> outputs;
      DriveRandomDecode(h, cfg.steps, /*seed=*/77, &outputs);
      *stall = h.total_stall_seconds();
      return outputs;
    };
    double fast_stall = 0, slow_stall = 0;
    const auto fast = run(nullptr, &fast_stall);
    const auto slow = run(std::make_unique<SlowCopyBackend>(), &slow_stall);
    EXPECT_GT(slow_stall, 0.0) << what << ": the slowed copies were never waited for";
    ASSERT_EQ(fast.size(), slow.size());
    for (size_t step = 0; step < fast.size(); ++step) {
      ASSERT_EQ(fast[step], slow[step]) << what << " step " << step;
    }
  }
}

}  // namespace
}  // namespace specula
