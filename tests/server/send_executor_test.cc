// SendExecutor: every task runs once, in posting order, and a busy machine cannot starve them.
#include "server/send_executor.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(SendExecutorTest, RunsEveryTaskOnceInPostingOrder) {
  std::mutex mu;
  std::vector<int> ran;
  {
    SendExecutor executor;
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&, t] {
        for (int i = 0; i < 500; ++i) {
          executor.Post([&, t, i] {
            std::lock_guard lock(mu);
            ran.push_back(t * 1000 + i);
          });
        }
      });
    }
    for (auto& p : posters) p.join();
  }  // the destructor finishes the queue
  ASSERT_EQ(ran.size(), 2000u);
  // Per poster, its tasks ran in the order it posted them.
  std::vector<int> last(4, -1);
  for (int v : ran) {
    EXPECT_GT(v % 1000, last[v / 1000]);
    last[v / 1000] = v % 1000;
  }
}

TEST(SendExecutorTest, BusyCoresCannotStarveDelivery) {
  SendExecutor executor(absl::Milliseconds(5));
  std::atomic<bool> stop{false};
  std::atomic<unsigned> spinning{0};
  std::vector<std::thread> burners;
  // Normal-priority spinners on every core: the SCHED_IDLE worker gets (almost) no CPU.
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < cores; ++i) {
    burners.emplace_back([&] {
      spinning.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  while (spinning.load() < cores) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(20));
  absl::Duration worst;
  for (int round = 0; round < 10; ++round) {
    absl::Notification done;
    const absl::Time posted = absl::Now();
    executor.Post([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    worst = std::max(worst, absl::Now() - posted);
  }
  stop = true;
  for (auto& b : burners) b.join();
  // 5 ms plus scheduling on a saturated machine; a starved task would take seconds.
  EXPECT_LT(worst, absl::Seconds(1));
}

TEST(SendExecutorTest, FallbackRunsWhatTheIdleWorkerLeavesAfterTheDelay) {
  SendExecutor executor(absl::Milliseconds(20), /*idle_worker=*/false);
  for (int round = 0; round < 3; ++round) {
    absl::Notification done;
    const absl::Time posted = absl::Now();
    executor.Post([&] { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_GE(absl::Now() - posted, absl::Milliseconds(19)) << "not before the delay";
  }
  EXPECT_EQ(executor.fallback_batches(), 3);
}

}  // namespace
}  // namespace specula
