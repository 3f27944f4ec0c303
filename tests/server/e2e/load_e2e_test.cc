// Load (issue 15): 256 concurrent streams, round after round for 10 s, on the tiny model, with a mix of
// clients that cancel and clients whose deadline passes. Afterwards no KV block is held, nothing
// is queued or running, and the process's resident memory is within 10% of its level after the
// warm-up rounds: nothing accumulates per request. A sample of the completed streams is checked
// token for token against the offline engine.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <thread>

#include "gtest/gtest.h"
#include "tests/server/e2e/test_server.h"

namespace specula::testing {
namespace {

constexpr int kStreams = 256;
// Warm-up until the allocator's arenas, thread stacks and gRPC's pools reach their working size:
// measured, resident memory grows by ~8% over the first 10 rounds and then by ~3% over the next
// 150 while the heap in use stays flat (fragmentation settling, not a leak).
constexpr int kWarmupRounds = 10;
constexpr int64_t kResidentSlackBytes = int64_t{32} << 20;
constexpr int kMinRounds = 4;                        // after the warm-up,
constexpr absl::Duration kLoadTime = absl::Seconds(10);  // and rounds until this long

enum class Kind { kComplete, kCancel, kDeadline };
Kind KindOf(int i) { return i % 8 == 3 ? Kind::kCancel : i % 8 == 5 ? Kind::kDeadline : Kind::kComplete; }
int MaxTokensOf(int i) { return KindOf(i) == Kind::kComplete ? 4 + i % 29 : 3000; }

// Bytes the program holds on the heap (glibc's count of allocated chunks and mmapped blocks):
// unlike resident memory, blind to freed memory the allocator keeps in its arenas.
int64_t HeapInUseBytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// One round: every stream on its own thread and channel. Returns the completed streams' results.
std::vector<StreamResult> Round(Server& server) {
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  clients.reserve(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server.address());
      const v1::GenerateRequest request = GreedyIds(PromptFor(i), MaxTokensOf(i));
      switch (KindOf(i)) {
        case Kind::kComplete:
          results[i] = RunGenerate(*stub, request);
          break;
        case Kind::kCancel:
          results[i] = RunGenerate(*stub, request, {},
                                   [](grpc::ClientContext& ctx, const v1::GenerateResponse& m) {
                                     if (m.token_ids_size() > 0) ctx.TryCancel();
                                   });
          break;
        case Kind::kDeadline:
          results[i] = RunGenerate(*stub, request, [](grpc::ClientContext& ctx) {
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
          });
          break;
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    const grpc::StatusCode code = results[i].status.error_code();
    switch (KindOf(i)) {
      case Kind::kComplete:
        EXPECT_EQ(code, grpc::StatusCode::OK) << i << ": " << results[i].status.error_message();
        EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(MaxTokensOf(i))) << i;
        break;
      case Kind::kCancel:
        EXPECT_EQ(code, grpc::StatusCode::CANCELLED) << i;
        break;
      case Kind::kDeadline:
        EXPECT_EQ(code, grpc::StatusCode::DEADLINE_EXCEEDED) << i;
        EXPECT_LT(results[i].tokens.size(), 3000u) << i;
        break;
    }
  }
  EXPECT_TRUE(server.engine().WaitIdle(absl::Now() + absl::Seconds(120)));
  return results;
}

TEST(LoadE2eTest, RoundsOf256StreamsWithCancelsAndDeadlinesLeaveNothingBehind) {
  auto server = StartServer([](ServerConfig& c) {
    c.scheduler.max_running_requests = 64;
    c.scheduler.max_waiting_requests = kStreams;
  });
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < kWarmupRounds; ++i) Round(*server);
  const int64_t warm = ResidentBytes();
  const int64_t warm_heap = HeapInUseBytes();
  std::vector<StreamResult> last;
  int rounds = 0;
  for (const absl::Time end = absl::Now() + kLoadTime; rounds < kMinRounds || absl::Now() < end;
       ++rounds) {
    last = Round(*server);
  }
  const int64_t after = ResidentBytes();
  const int64_t after_heap = HeapInUseBytes();
  std::cout << rounds << " rounds of " << kStreams << " streams; resident " << warm << " -> "
            << after << " bytes, heap in use " << warm_heap << " -> " << after_heap << "\n";

  const EngineLoad load = server->engine().load();
  EXPECT_EQ(load.kv_blocks_used, 0);
  EXPECT_EQ(load.running, 0);
  EXPECT_EQ(load.waiting, 0);
  // A leak shows in the heap in use. Resident memory also carries the allocator's arenas, which
  // grow by a machine-dependent ~8-15 MB under 256 threads while the heap stays flat
  // (docs/HARDENING.md, "Load"): it gets the looser bound.
  EXPECT_LE(after_heap, warm_heap + warm_heap / 10)
      << "heap in use grew from " << warm_heap << " to " << after_heap << " bytes over " << rounds
      << " rounds";
  EXPECT_LE(after, warm + std::max(warm / 10, kResidentSlackBytes))
      << "resident memory grew from " << warm << " to " << after << " bytes over " << rounds
      << " rounds";
  for (int i = 0; i < kStreams; i += 37) {
    if (KindOf(i) != Kind::kComplete) continue;
    EXPECT_EQ(last[i].tokens, Offline(PromptFor(i), MaxTokensOf(i)).tokens) << i;
  }
}

}  // namespace
}  // namespace specula::testing
