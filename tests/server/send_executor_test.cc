// SendExecutor: every task runs once, in posting order, including what is queued at destruction.
#include "server/send_executor.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace specula
