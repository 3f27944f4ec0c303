// End to end, the sparse KV cache as the API shows it: the per-request mode and budget, kv_stats
// on the final response, the errors for impossible requests, the page and slot accounting after
// cancellations (docs/ARCHITECTURE.md §4 invariant 3) and the prefetch metrics.
#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/e2e/test_server.h"
#include "tests/server/prometheus_scrape.h"
#include "tests/server/sparse_metric_families.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

// A working set far smaller than the prompts below (sinks 1 page + recent 1 page + budget 2 pages
// of 16 tokens), so decode steps select, hit, miss and prefetch; every request runs sparse unless
// it asks for dense.
void SparseConfig(ServerConfig& c) {
  c.sparse.options.enabled = true;
  c.sparse.options.budget_tokens = 32;
  c.sparse.options.sink_tokens = 16;
  c.sparse.options.recent_tokens = 16;
  c.sparse.options.min_context_tokens = 0;
  c.kv_cache.host_capacity_tokens = 65536;
  c.sparse.page_size = 16;
  c.kv_cache.page_size = 16;
}

std::vector<int32_t> LongPrompt(int i, int n) {
  std::vector<int32_t> prompt;
  for (int j = 0; j < n; ++j) prompt.push_back(1 + (i * 37 + j * 11) % 500);
  return prompt;
}

v1::GenerateRequest WithSparse(v1::GenerateRequest r, v1::SparseMode mode, uint32_t budget = 0) {
  r.mutable_sparse()->set_mode(mode);
  r.mutable_sparse()->set_budget_tokens(budget);
  return r;
}

// Runs `request`, checking that kv_stats come only with the last message.
StreamResult RunChecked(v1::Specula::Stub& stub, const v1::GenerateRequest& request) {
  return RunGenerate(stub, request, {}, [](grpc::ClientContext&, const v1::GenerateResponse& m) {
    EXPECT_EQ(m.has_kv_stats(), m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED);
  });
}

void ExpectSparseStats(const StreamResult& got, uint64_t budget) {
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_TRUE(got.kv_stats.has_value());
  const v1::KvStats& k = *got.kv_stats;
  EXPECT_TRUE(k.sparse());
  EXPECT_EQ(k.budget_tokens(), budget);
  const uint64_t selected = k.pages_hit() + k.pages_missed() + k.pages_late();
  EXPECT_GT(selected, 0u) << "a 200-token context over a 64-token working set selects pages";
  EXPECT_GE(k.hit_rate(), 0);
  EXPECT_LE(k.hit_rate(), 1);
  EXPECT_DOUBLE_EQ(k.hit_rate(), static_cast<double>(k.pages_hit()) / selected);
  EXPECT_GE(k.stall_seconds(), 0);
}

TEST(SparseE2eTest, SparseRequestsReportKvStatsAndDenseOnesSayDense) {
  auto server = StartServer(SparseConfig);
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  const std::vector<int32_t> prompt = LongPrompt(1, 200);

  StreamResult sparse =
      RunChecked(*stub, WithSparse(GreedyIds(prompt, 16), v1::SPARSE_MODE_SPARSE));
  ExpectSparseStats(sparse, 32);
  EXPECT_EQ(sparse.tokens.size(), 16u);
  EXPECT_EQ(sparse.finish, v1::LENGTH);

  // min_context_tokens 0: the server's default for this request is sparse.
  ExpectSparseStats(RunChecked(*stub, GreedyIds(prompt, 16)), 32);
  // The request's own budget.
  ExpectSparseStats(
      RunChecked(*stub, WithSparse(GreedyIds(prompt, 16), v1::SPARSE_MODE_SPARSE, 64)), 64);

  StreamResult dense = RunChecked(*stub, WithSparse(GreedyIds(prompt, 16), v1::SPARSE_MODE_DENSE));
  ASSERT_TRUE(dense.status.ok()) << dense.status.error_message();
  ASSERT_TRUE(dense.kv_stats.has_value());
  EXPECT_FALSE(dense.kv_stats->sparse());
  EXPECT_EQ(dense.kv_stats->pages_hit() + dense.kv_stats->pages_missed(), 0u);
  EXPECT_EQ(dense.kv_stats->bytes_prefetched() + dense.kv_stats->bytes_fetched(), 0u);
  EXPECT_EQ(dense.tokens, Offline(prompt, 16).tokens);
}

// docs/ARCHITECTURE.md §4 invariant 1, seen from the API: a budget covering the whole context is
// dense attention, so greedy output equals the dense engine's.
TEST(SparseE2eTest, BudgetCoveringTheContextGivesTheDenseOutput) {
  auto server = StartServer(SparseConfig);
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  const std::vector<int32_t> prompt = LongPrompt(2, 200);
  StreamResult got =
      RunChecked(*stub, WithSparse(GreedyIds(prompt, 24), v1::SPARSE_MODE_SPARSE, 4096));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  ASSERT_TRUE(got.kv_stats.has_value());
  EXPECT_TRUE(got.kv_stats->sparse());
  EXPECT_EQ(got.tokens, Offline(prompt, 24).tokens);
}

// kv_cache.dtype: bf16 as a user configures it: GetModelInfo reports it, and invariant 1 holds
// in bf16 (sparse and dense read the same rounded keys), while the output differs from the
// fp32 server's only as bf16 rounding may make it.
TEST(SparseE2eTest, Bf16KvCacheServesAndFullBudgetStillEqualsDense) {
  auto server = StartServer([](ServerConfig& c) {
    SparseConfig(c);
    c.kv_cache.dtype = "bf16";
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.kv_cache_dtype(), "bf16");

  const std::vector<int32_t> prompt = LongPrompt(4, 200);
  StreamResult sparse =
      RunChecked(*stub, WithSparse(GreedyIds(prompt, 24), v1::SPARSE_MODE_SPARSE, 4096));
  StreamResult dense = RunChecked(*stub, WithSparse(GreedyIds(prompt, 24), v1::SPARSE_MODE_DENSE));
  ASSERT_TRUE(sparse.status.ok()) << sparse.status.error_message();
  ASSERT_TRUE(dense.status.ok()) << dense.status.error_message();
  EXPECT_TRUE(sparse.kv_stats->sparse());
  EXPECT_EQ(sparse.tokens, dense.tokens);
  EXPECT_EQ(sparse.tokens.size(), 24u);
}

TEST(SparseE2eTest, SparseOnAServerWithoutItIsFailedPrecondition) {
  auto server = StartServer();  // sparse.enabled: false
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  const v1::GenerateRequest base = GreedyIds(PromptFor(1), 4);

  StreamResult got = RunGenerate(*stub, WithSparse(base, v1::SPARSE_MODE_SPARSE));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << got.status.error_message();
  EXPECT_THAT(got.status.error_message(), HasSubstr("sparse.enabled"));
  EXPECT_EQ(got.messages, 0);
  // A budget is a request for sparse attention too.
  got = RunGenerate(*stub, WithSparse(base, v1::SPARSE_MODE_DEFAULT, 64));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << got.status.error_message();

  // Asking for dense, or for nothing, is fine and reported as dense.
  for (v1::SparseMode mode : {v1::SPARSE_MODE_DENSE, v1::SPARSE_MODE_DEFAULT}) {
    got = RunChecked(*stub, WithSparse(base, mode));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_TRUE(got.kv_stats.has_value());
    EXPECT_FALSE(got.kv_stats->sparse());
  }
  // The last message can reach the client before the engine thread retires its sequence.
  ASSERT_TRUE(server->engine().WaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(server->engine().load().waiting, 0);
  EXPECT_EQ(server->engine().load().kv_blocks_used, 0);
}

TEST(SparseE2eTest, RequestsTheHostStoreCanNeverHoldAreResourceExhausted) {
  auto server = StartServer([](ServerConfig& c) {
    SparseConfig(c);
    c.kv_cache.host_capacity_tokens = 256;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  StreamResult got =
      RunGenerate(*stub, WithSparse(GreedyIds(LongPrompt(3, 200), 100), v1::SPARSE_MODE_SPARSE));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  EXPECT_THAT(got.status.error_message(), HasSubstr("can never fit"));
  EXPECT_THAT(got.status.error_message(), HasSubstr("host_capacity_tokens"));
  // Dense, the same request fits the device KV cache.
  got = RunGenerate(*stub, WithSparse(GreedyIds(LongPrompt(3, 200), 100), v1::SPARSE_MODE_DENSE));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
}

// The point of the host store: a sparse request longer than the device KV cache. Without
// max_tokens it gets the server's default length, not one token cut to the device cache's room.
TEST(SparseE2eTest, SparseRequestsLongerThanTheDeviceCacheGetTheDefaultLength) {
  auto server = StartServer([](ServerConfig& c) {
    SparseConfig(c);
    c.kv_cache.capacity_tokens = 1024;
    c.scheduler.default_max_tokens = 12;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::GenerateRequest req = GreedyIds(LongPrompt(4, 1500), 1);
  req.mutable_stopping()->clear_max_tokens();
  StreamResult got = RunChecked(*stub, req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens.size(), 12u);
  EXPECT_EQ(got.finish, v1::LENGTH);
  ASSERT_TRUE(got.kv_stats.has_value());
  EXPECT_TRUE(got.kv_stats->sparse());
  // Dense, the same prompt can never fit the device cache.
  got = RunGenerate(*stub, WithSparse(req, v1::SPARSE_MODE_DENSE));
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  EXPECT_THAT(got.status.error_message(), HasSubstr("kv_cache.capacity_tokens"));
}

// docs/ARCHITECTURE.md §4 invariant 3 over the API: finishing or cancelling sparse requests returns
// every host page, device slot and KV block, as the operator's /metrics shows it.
TEST(SparseE2eTest, CancellingTenOfAHundredSparseStreamsReturnsEveryPageAndSlot) {
  auto server = StartServer([](ServerConfig& c) {
    SparseConfig(c);
    c.server.metrics_listen = "127.0.0.1:0";
  });
  ASSERT_NE(server, nullptr);
  // Watches the load while the streams run, so the zeros at the end are not the zeros of a test
  // that never held a page.
  std::atomic<bool> done{false};
  std::atomic<int64_t> max_host_pages{0}, max_device_slots{0};
  std::thread monitor([&] {
    while (!done.load()) {
      const EngineLoad load = server->engine().load();
      max_host_pages = std::max(max_host_pages.load(), load.host_pages_used);
      max_device_slots = std::max(max_device_slots.load(), load.device_slots_used);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<StreamResult> results = RunHundredCancellingTen(*server, [](int i, int max_tokens) {
    return WithSparse(GreedyIds(LongPrompt(i, 80 + i % 50), max_tokens), v1::SPARSE_MODE_SPARSE);
  });
  done = true;
  monitor.join();
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    if (CancelledOfHundred(i) || !results[i].status.ok()) continue;
    ASSERT_TRUE(results[i].kv_stats.has_value()) << i;
    EXPECT_TRUE(results[i].kv_stats->sparse()) << i;
  }
  EXPECT_GT(max_host_pages.load(), 0);
  EXPECT_GT(max_device_slots.load(), 0);

  Exposition m = ScrapeMetrics(server->metrics().metrics_port());
  EXPECT_THAT(m.errors, ::testing::IsEmpty());
  EXPECT_EQ(m.Get("specula_kv_host_pages_used"), 0);
  EXPECT_EQ(m.Get("specula_kv_device_slots_used"), 0);
  EXPECT_EQ(m.Get("specula_kv_cache_blocks_used"), 0);
  EXPECT_GT(m.Get("specula_kv_host_pages_capacity"), 0);
  EXPECT_EQ(m.Get(R"(specula_requests_total{code="CANCELLED",finish_reason="cancelled"})"), 10);
  EXPECT_EQ(m.Get("specula_num_requests_running"), 0);
}

TEST(SparseE2eTest, PrefetchMetricsAgreeWithThePerRequestKvStats) {
  auto server = StartServer([](ServerConfig& c) {
    SparseConfig(c);
    c.server.metrics_listen = "127.0.0.1:0";
  });
  ASSERT_NE(server, nullptr);
  constexpr int kStreams = 8;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server->address());
      // Two dense streams in the mix: they must add nothing to the sparse counters.
      const v1::SparseMode mode = i < 2 ? v1::SPARSE_MODE_DENSE : v1::SPARSE_MODE_SPARSE;
      results[i] = RunChecked(*stub, WithSparse(GreedyIds(LongPrompt(i, 150 + 10 * i), 20), mode));
    });
  }
  for (auto& t : clients) t.join();
  ASSERT_TRUE(server->engine().WaitIdle(absl::Now() + absl::Seconds(30)));
  uint64_t hits = 0, misses = 0, late = 0, fetched = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    ASSERT_TRUE(results[i].kv_stats.has_value()) << i;
    EXPECT_EQ(results[i].kv_stats->sparse(), i >= 2) << i;
    hits += results[i].kv_stats->pages_hit();
    misses += results[i].kv_stats->pages_missed();
    late += results[i].kv_stats->pages_late();
    fetched += results[i].kv_stats->bytes_fetched();
  }
  ASSERT_GT(hits + misses, 0u);

  Exposition m = ScrapeMetrics(server->metrics().metrics_port());
  EXPECT_THAT(m.errors, ::testing::IsEmpty());
  for (const auto& [name, type] : SparseMetricFamilies()) {
    auto it = m.types.find(name);
    ASSERT_NE(it, m.types.end()) << name;
    EXPECT_EQ(it->second, type) << name;
  }
  EXPECT_EQ(m.Get("specula_prefetch_hits_total"), static_cast<double>(hits));
  EXPECT_EQ(m.Get("specula_prefetch_misses_total"), static_cast<double>(misses));
  EXPECT_EQ(m.Get("specula_prefetch_late_total"), static_cast<double>(late));
  EXPECT_EQ(m.Get("specula_decode_fetch_bytes_total"), static_cast<double>(fetched));
  const double ratio = m.Get("specula_prefetch_hit_ratio");
  EXPECT_GE(ratio, 0);
  EXPECT_LE(ratio, 1);
  EXPECT_GE(m.Get("specula_decode_stall_seconds_total"), 0);
  EXPECT_EQ(m.Get("specula_kv_host_pages_used"), 0);
  EXPECT_EQ(m.Get("specula_kv_device_slots_used"), 0);
}

}  // namespace
}  // namespace specula::testing
