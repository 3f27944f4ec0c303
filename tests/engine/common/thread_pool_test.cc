#include "engine/common/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

// Every index is visited exactly once, for uneven sizes, tiny and large chunks, and many
// back-to-back calls (the engine calls ParallelFor several times per layer).
TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 100, 1001}) {
      for (int64_t min_chunk : {1, 3, 64}) {
        for (int rep = 0; rep < 20; ++rep) {
          std::vector<std::atomic<int>> hits(n);
          pool.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e) {
            ASSERT_LE(b, e);
            for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
          });
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
          }
        }
      }
    }
  }
}

TEST(ThreadPoolTest, EmptyRangeCallsNothing) {
  ThreadPool pool(2);
  bool called = false;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace specula
