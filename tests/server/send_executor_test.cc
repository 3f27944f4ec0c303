// SendExecutor: every task runs exactly once, a task never waits much past the delay bound even
// with the worker gone, and the destructor finishes the queue.
#include "server/send_executor.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
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
    absl::Notification done;
    const absl::Time posted = absl::Now();
    executor.Post([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
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
  absl::Notification release, behind_ran;
  executor.Post([&] { release.WaitForNotification(); });
  executor.Post([&] { behind_ran.Notify(); });
  EXPECT_TRUE(behind_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(executor.fallback_tasks(), 1);
  release.Notify();
}

}  // namespace
}  // namespace specula
