#include "server/memory_trimmer.h"

#include <malloc.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/process_limits.h"

namespace specula {
namespace {

// What gRPC does to glibc's heap: many small blocks freed, one in every few kept alive, so no
// free() can give the pages between back. The trimmer must.
TEST(MemoryTrimmerTest, GivesBackFreePagesThatFreeKeptFragmented) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators replace glibc's heap, which malloc_trim trims";
#endif
  mallopt(M_TRIM_THRESHOLD, 128 << 10);  // fixed, whatever earlier tests freed
  constexpr int kBlocks = 16384;
  constexpr size_t kBlockBytes = 4000;  // 64 MB in all, below the mmap threshold: on the heap
  std::vector<std::unique_ptr<char[]>> blocks(kBlocks);
  for (auto& b : blocks) {
    b.reset(new char[kBlockBytes]);
    std::fill_n(b.get(), kBlockBytes, 1);  // resident
  }
  for (int i = 0; i < kBlocks; ++i) {
    if (i % 16 != 0) blocks[i].reset();  // every 16th block (64 KB apart) stays
  }
  const int64_t fragmented = ResidentBytes();

  MemoryTrimmer trimmer(absl::Milliseconds(10));
  while (trimmer.trims() < 1) std::this_thread::yield();

  EXPECT_LT(ResidentBytes(), fragmented - (40 << 20));  // of the ~60 MB freed
}

TEST(MemoryTrimmerTest, StopsPromptlyWhenDestroyed) {
  const absl::Time start = absl::Now();
  { MemoryTrimmer trimmer(absl::Hours(1)); }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // not the hour of its first wait
}

}  // namespace
}  // namespace specula
