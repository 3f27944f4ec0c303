#include "server/process_limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

int OpenDescriptors() {
  int n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

TEST(DescriptorReserveTest, HoldsItsDescriptorsUntilReleased) {
  const int before = OpenDescriptors();
  DescriptorReserve reserve(8);
  EXPECT_EQ(reserve.held(), 8);
  EXPECT_EQ(OpenDescriptors(), before + 8);
  reserve.Release();
  EXPECT_EQ(reserve.held(), 0);
  EXPECT_EQ(OpenDescriptors(), before);
  reserve.Release();  // a second fatal report releases nothing more
  EXPECT_EQ(OpenDescriptors(), before);
}

// Lowers this process's soft open-file limit to `spare` above what is open now, for one test.
class SpareDescriptors {
 public:
  explicit SpareDescriptors(int spare) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit low = saved_;
    low.rlim_cur = OpenDescriptors() + spare;
    lowered_ = setrlimit(RLIMIT_NOFILE, &low) == 0;
  }
  ~SpareDescriptors() { setrlimit(RLIMIT_NOFILE, &saved_); }
  bool lowered() const { return lowered_; }

 private:
  rlimit saved_{};
  bool lowered_ = false;
};

// The situation it exists for: clients took every other descriptor; releasing the reserve lets
// the process open a pipe again.
TEST(DescriptorReserveTest, ReleaseGivesAnExhaustedProcessDescriptorsBack) {
  SpareDescriptors limit(32);
  ASSERT_TRUE(limit.lowered());
  DescriptorReserve reserve(4);
  ASSERT_EQ(reserve.held(), 4);
  std::vector<int> taken;
  int p[2];
  while (pipe(p) == 0) taken.insert(taken.end(), {p[0], p[1]});
  EXPECT_EQ(errno, EMFILE);
  reserve.Release();
  const bool piped = pipe(p) == 0;
  if (piped) taken.insert(taken.end(), {p[0], p[1]});
  for (int fd : taken) close(fd);
  EXPECT_TRUE(piped);
}

TEST(DescriptorReserveTest, StopsAtTheLimitInsteadOfFailing) {
  SpareDescriptors limit(3);
  ASSERT_TRUE(limit.lowered());
  DescriptorReserve reserve(16);
  EXPECT_GE(reserve.held(), 1);
  EXPECT_LT(reserve.held(), 16);
}

}  // namespace
}  // namespace specula
