// SendExecutor: every task runs exactly once, a task never waits much past the delay bound even
// with the worker gone, and the destructor finishes the queue.
#include "server/send_executor.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

class SendExecutorTest : public ::testing::TestWithParam<SendExecutor::Priority> {};

TEST_P(SendExecutorTest, RunsEveryTaskExactlyOnce) {
  std::mutex mu;
  std::multiset<int> ran;
  {
    SendExecutor executor(GetParam());
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&, t] {
        for (int i = 0; i < 500; ++i) {
          executor.Post([&, t, i] {
            std::lock_guard lock(mu);
            ran.insert(t * 1000 + i);
          });
        }
      });
    }
    for (auto& p : posters) p.join();
  }  // the destructor finishes the queue
  ASSERT_EQ(ran.size(), 2000u);
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 500; ++i) EXPECT_EQ(ran.count(t * 1000 + i), 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Priorities, SendExecutorTest,
                         ::testing::Values(SendExecutor::Priority::kIdle,
                                           SendExecutor::Priority::kNormal));

TEST(SendExecutorFallbackTest, RunsWhatTheWorkerLeavesAfterTheDelay) {
  SendExecutor executor(SendExecutor::Priority::kIdle, absl::Milliseconds(20),
                        /*worker=*/false);
  for (int round = 0; round < 3; ++round) {
    std::promise<void> done;  // std, not absl::Notification: visible to ThreadSanitizer
    const absl::Time posted = absl::Now();
    executor.Post([&] { done.set_value(); });
    ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
    const absl::Duration waited = absl::Now() - posted;
    EXPECT_GE(waited, absl::Milliseconds(19)) << "not before the delay";
    EXPECT_LT(waited, absl::Seconds(5));
  }
  EXPECT_EQ(executor.fallback_tasks(), 3);
}

TEST(SendExecutorFallbackTest, TakesTasksBehindOneThatBlocks) {
  SendExecutor executor(SendExecutor::Priority::kNormal, absl::Milliseconds(5));
  // The worker is stuck in a task (as if it lost its CPU mid-send): the ones queued behind it
  // still run, through the fallback.
  std::promise<void> release, behind_ran;
  std::shared_future<void> released = release.get_future().share();
  executor.Post([released] { released.wait(); });
  executor.Post([&] { behind_ran.set_value(); });
  EXPECT_EQ(behind_ran.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_GE(executor.fallback_tasks(), 1);
  release.set_value();
}

}  // namespace
}  // namespace specula
