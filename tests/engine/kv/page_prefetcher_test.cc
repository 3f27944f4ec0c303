// The prefetch executor's own rules (engine/kv/page_prefetcher.h), on a copy stream the test
// can hold: a staging buffer is not rewritten before the gather that read it two steps earlier
// has run (else the pages it staged would never land), the wait for it is counted as stall, and
// prefetch latencies are counted per page moved, never for an empty gather.
#include <chrono>
#include <cstring>
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

constexpr int32_t kPageSize = 4;
constexpr int32_t kPromptPages = 40;  // page 0 sink, 1..38 candidates, 39 in the window

// Page p's keys point along channel p: a query with weight on channels picks those pages.
void PageKeys(int64_t, int32_t, int32_t, int32_t pos, float* k, float* v) {
  const int32_t page = pos / kPageSize;
  for (int32_t c = 0; c < 64; ++c) {
    k[c] = (page < kPromptPages && c == page) ? 10.0f : 0.0f;
    v[c] = static_cast<float>(page);
  }
}

std::vector<float> Query(const std::vector<int32_t>& pages) {
  std::vector<float> q(2 * 64, 0.0f);
  for (int32_t h = 0; h < 2; ++h) {
    for (int32_t p : pages) q[h * 64 + p] = 1.0f;
  }
  return q;
}

SparseOptions Options() {
  SparseOptions o;
  o.enabled = true;
  o.budget_tokens = 4 * kPageSize;
  o.sink_tokens = kPageSize;
  o.recent_tokens = kPageSize;
  o.prefetch_extra_tokens = 4 * kPageSize;  // room for both sets
  o.speculation = SpeculationMode::kNone;
  o.min_context_tokens = 0;
  return o;
}

TEST(PagePrefetcherTest, AStagingBufferWaitsForTheGatherThatLastReadIt) {
  auto backend = std::make_unique<GatedCopyBackend>();
  CopyGate& gate = backend->gate();
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(), shape, PageKeys, std::move(backend));
  auto ws = h.Start(1, kPromptPages * kPageSize, 8, 0);
  h.cache().WaitForPrefetches();
  const std::vector<int32_t> a = {3, 8, 13, 18}, b = {23, 28, 33, 36};
  // Step 0 misses A and stages it; its gather is held. Step 1 stages B (queued behind it).
  gate.Close(std::chrono::milliseconds(400));
  h.Step({ws.get()}, {Query(a)});
  ASSERT_TRUE(gate.WaitForHeld(1, std::chrono::seconds(30)));
  h.Step({ws.get()}, {Query(b)});
  EXPECT_EQ(h.cache().Stats(*ws).pages_missed, 8);
  // Step 2 rewrites step 0's staging buffer: first the compute stream waits for step 0's gather
  // (released by the gate's time limit), so A has landed when the selection runs: all hits.
  h.Step({ws.get()}, {Query(a)});
  EXPECT_EQ(h.last_step().pages_hit, 4);
  EXPECT_EQ(h.last_step().pages_late, 0);
  EXPECT_GT(h.last_step().stall_seconds, 0.05);  // it waited for the held gather
  gate.Open();
  h.cache().WaitForPrefetches();
  h.Step({ws.get()}, {Query(b)});
  EXPECT_EQ(h.last_step().pages_hit, 4);  // B landed too
  h.Finish(*ws);
}

TEST(PagePrefetcherTest, LatenciesArePerPageMovedNeverPerEmptyGather) {
  HarnessShape shape;
  shape.page_size = kPageSize;
  SparseHarness h(Options(), shape, PageKeys);
  auto ws = h.Start(1, kPromptPages * kPageSize, 8, 0);
  h.cache().WaitForPrefetches();
  h.Step({ws.get()}, {Query({3, 8, 13, 18})});  // four misses staged
  // Its gather is seen landed at that step's end or by the wait: its samples come with the
  // first step or the second.
  size_t samples = h.last_step().prefetch_latencies_seconds.size();
  h.cache().WaitForPrefetches();
  h.Step({ws.get()}, {Query({3, 8, 13, 18})});  // all hits: an empty gather
  samples += h.last_step().prefetch_latencies_seconds.size();
  EXPECT_EQ(samples, 4u);  // one per page, none for the empty gather
  EXPECT_EQ(h.last_step().bytes_prefetched, 0);
  h.cache().WaitForPrefetches();
  h.Step({ws.get()}, {Query({3, 8, 13, 18})});
  EXPECT_TRUE(h.last_step().prefetch_latencies_seconds.empty());
  for (double s : h.last_step().prefetch_latencies_seconds) EXPECT_GE(s, 0.0);
  h.Finish(*ws);
}

// A copy-gated backend whose compute stream lags: the events it records stay pending until the
// test completes them, as on a GPU whose compute stream is still running the selection.
class LaggingComputeBackend : public GatedCopyBackend {
 public:
  class Lagging : public Stream {
   public:
    explicit Lagging(Stream& real) : real_(real) {}
    void CopyPages(absl::Span<const PageCopy> c, size_t bytes) override { real_.CopyPages(c, bytes); }
    std::shared_ptr<Event> Record() override {
      pending_.push_back(std::make_shared<CpuEvent>(nullptr));
      return pending_.back();
    }
    std::shared_ptr<Event> RecordTimed() override { return real_.RecordTimed(); }
    void Wait(const std::shared_ptr<Event>& e) override { real_.Wait(e); }
    void Synchronize() override { real_.Synchronize(); }
    void CatchUp() {
      for (auto& e : pending_) e->Complete();
    }

   private:
    Stream& real_;
    std::vector<std::shared_ptr<CpuEvent>> pending_;
  };
  Stream& compute_stream() override { return lagging_; }
  Lagging& lagging() { return lagging_; }

 private:
  Lagging lagging_{CpuBackend::compute_stream()};
};

TEST(PagePrefetcherTest, AGatherWaitsForTheSelectionThatWroteItsLists) {
  // A gather reads its lists when it runs, like a kernel: it must run after the compute stream's
  // selection wrote them. Here the selection is still "running" (its event pending) when Launch
  // returns; the lists are written only then. Without the copy stream's wait on the compute
  // stream, the gather reaches the copy gate at once (and would read empty lists on a GPU).
  auto backend = std::make_unique<LaggingComputeBackend>();
  LaggingComputeBackend& b = *backend;
  const size_t page_bytes = 64;
  PagePrefetcher prefetcher(b, 1, /*layers=*/1, page_bytes);
  ASSERT_TRUE(prefetcher.Prepare(StagingKind::kResolve, /*lists=*/1, /*stride=*/1).ok());
  DeviceBuffer src = b.AllocatePinnedHost(page_bytes).value();
  DeviceBuffer dst = b.Allocate(page_bytes).value();
  DeviceBuffer state = b.Allocate(sizeof(int32_t)).value();
  std::memset(src.data(), 'k', page_bytes);
  std::memset(dst.data(), 0, page_bytes);
  *state.as<int32_t>() = kSlotLoading;
  PageStaging staging = prefetcher.Staging(StagingKind::kResolve, 0);
  b.Host(staging.copy_count)[0] = 0;  // what an earlier step left: nothing
  b.gate().Close(std::chrono::seconds(30));
  prefetcher.Launch(StagingKind::kResolve, 0);
  // The selection has not finished: the gather must not have started.
  EXPECT_FALSE(b.gate().WaitForHeld(1, std::chrono::milliseconds(300)));
  b.Host(staging.copies)[0] = PageGatherEntry{src.data(), dst.data(), state.as<int32_t>()};
  b.Host(staging.copy_count)[0] = 1;
  b.lagging().CatchUp();
  EXPECT_TRUE(b.gate().WaitForHeld(1, std::chrono::seconds(30)));
  b.gate().Open();
  prefetcher.Drain();
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), page_bytes), 0);
  EXPECT_EQ(*state.as<int32_t>(), kSlotReady);
}

}  // namespace
}  // namespace specula
