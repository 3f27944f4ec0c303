// Load (issue 15): 256 concurrent streams, round after round for 10 s, on the tiny model, with a mix of
// clients that cancel and clients whose deadline passes. Afterwards no KV block is held, nothing
// is queued or running, and the process's resident memory is within 10% of its level after the
// warm-up rounds: nothing accumulates per request. A sample of the completed streams is checked
// token for token against the offline engine. And (issue 32) idle connections that come and go
// leave the daemon's resident memory near its level before them.
//
// These tests measure resident memory, so the sanitizer stages leave them out.
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "gtest/gtest.h"
#include "server/process_limits.h"
#include "tests/server/e2e/daemon.h"
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

// Issue 32: 19,900 idle gRPC connections took the daemon from 277 to 530 MB resident, and it
// stayed there after they closed: glibc kept the freed memory, and gRPC keeps a small object per
// peak connection for good, pinning freed pages. The daemon trims its heap, and holds at most
// server.connections.grpc_max_connections (2,048) at once, closing the rest as it accepts them,
// so a wave of 5,000 connections (each sending the HTTP/2 preface, so gRPC builds its transport)
// leaves it within max(10%, 20 MB) of its level before. Without the cap it stayed ~+30 MB.
TEST(LoadE2eTest, IdleConnectionsThatCameAndWentLeaveResidentMemoryNearItsLevelBefore) {
  const char* wave = std::getenv("SPECULA_CONNECTION_WAVE");  // to measure other sizes by hand
  const int connections = wave != nullptr ? std::atoi(wave) : 5000;
  constexpr int kCap = 2048;  // the default
  rlimit files{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max != RLIM_INFINITY && files.rlim_max < static_cast<rlim_t>(connections + 256)) {
    GTEST_SKIP() << "the open-file hard limit " << files.rlim_max << " is too low";
  }
  RaiseOpenFileLimit();  // this process holds the client ends
  auto daemon = Daemon::Start({"--model=" + TestModelDir(), "--listen=127.0.0.1:0",
                               "--metrics-listen=", "--device=cpu"});
  ASSERT_FALSE(daemon->address().empty()) << daemon->Log();
  auto stub = Connect(daemon->address());
  ASSERT_TRUE(RunGenerate(*stub, GreedyIds(PromptFor(1), 4)).status.ok());
  const int64_t before = ResidentBytes(daemon->pid());

  std::vector<int> held;
  for (int i = 0; i < connections; ++i) {
    // Eight source addresses: each connection's port stays in TIME_WAIT after it closes.
    const int fd = ConnectTcp(daemon->address(), "127.0.0." + std::to_string(2 + i % 8));
    ASSERT_GE(fd, 0) << "connection " << i << ": " << strerror(errno);
    SendHttp2Preface(fd);  // fails with EPIPE once the daemon closed a refused connection
    held.push_back(fd);
  }
  // A refused connection reads end of file instead of the daemon's SETTINGS.
  int served = 0;
  for (int fd : held) served += ReadSettingsAck(fd) ? 1 : 0;
  const int64_t peak = ResidentBytes(daemon->pid());
  for (int fd : held) close(fd);
  EXPECT_LE(served, kCap - 1) << "the stub's own connection is one of the 2,048";
  EXPECT_GE(served, std::min(connections, kCap - 1) - 8) << "connections below the cap served";
  std::cout << connections << " connections, " << served << " served; resident " << before
            << " -> " << peak << " bytes\n";

  const int64_t allowed = before + std::max<int64_t>(before / 10, int64_t{20} << 20);
  // Without this much growth the test would prove nothing (measured: ~35 MB).
  EXPECT_GT(peak, allowed) << "before " << before << ", peak " << peak;
  // The trimmer runs every 10 s.
  int64_t now = peak;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       (now = ResidentBytes(daemon->pid())) > allowed && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::cout << "resident after they went: " << now << " bytes\n";
  EXPECT_LE(now, allowed) << "before " << before << ", peak " << peak << ", now " << now;
  kill(daemon->pid(), SIGTERM);
  EXPECT_EQ(daemon->Wait(), 0) << daemon->Log();
}

}  // namespace
}  // namespace specula::testing
