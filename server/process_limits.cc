#include "server/process_limits.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace specula {

OpenFileLimits RaiseOpenFileLimit() {
  OpenFileLimits out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  out.soft_before = out.soft = limit.rlim_cur;
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) {
    // setrlimit refuses more than the kernel's per-process maximum.
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    unsigned long long kernel_max = 0;
    target = (nr_open >> kernel_max) && kernel_max > 0 ? static_cast<rlim_t>(kernel_max) : 65536;
  }
  out.hard = target;
  if (limit.rlim_cur >= target) return out;
  limit.rlim_cur = target;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) out.soft = target;
  return out;
}

int64_t ResidentBytes(int pid) {
  std::ifstream statm(pid == 0 ? std::string("/proc/self/statm")
                               : "/proc/" + std::to_string(pid) + "/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

DescriptorReserve::DescriptorReserve(int count) {
  for (int i = 0; i < count; ++i) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    fds_.push_back(fd);
  }
}

DescriptorReserve::~DescriptorReserve() { Release(); }

int DescriptorReserve::held() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(fds_.size());
}

void DescriptorReserve::Release() {
  std::lock_guard lock(mu_);
  for (int fd : fds_) close(fd);
  fds_.clear();
}

}  // namespace specula
