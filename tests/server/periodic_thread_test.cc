// The loop behind the server's background threads.
#include "server/periodic_thread.h"

#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace specula {
namespace {

// Runs again and again; once the destructor returns, no run is going or starts (a run that saw
// `destroyed` would fail the test).
TEST(PeriodicThreadTest, RunsTheTaskEachPeriodUntilDestroyed) {
  std::mutex mu;
  std::condition_variable ran;
  int runs = 0;
  bool destroyed = false;
  {
    PeriodicThread thread(absl::Milliseconds(1), [&] {
      std::lock_guard lock(mu);
      EXPECT_FALSE(destroyed);
      ++runs;
      ran.notify_all();
    });
    std::unique_lock lock(mu);
    ASSERT_TRUE(ran.wait_for(lock, std::chrono::seconds(30), [&] { return runs >= 3; }));
  }
  std::lock_guard lock(mu);
  destroyed = true;
}

// The destructor does not wait out the period (an hour here: waiting would time the test out),
// and a task never due never runs.
TEST(PeriodicThreadTest, StopsWithoutWaitingForTheNextRun) {
  bool ran = false;
  { PeriodicThread thread(absl::Hours(1), [&] { ran = true; }); }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace specula
