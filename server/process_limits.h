// Process-wide resource limits the daemon adjusts at startup.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace specula {

struct OpenFileLimits {
  uint64_t soft_before = 0;  // the soft limit the process started with
  uint64_t soft = 0;         // the soft limit now
  uint64_t hard = 0;         // the hard limit (the kernel's maximum when unlimited)
};

// Raises the soft limit of open files to the hard limit (capped by the kernel's
// /proc/sys/fs/nr_open when the hard limit is unlimited): idle HTTP connections (up to 1024 on
// the metrics port) and gRPC's sockets share the process's descriptors, and the usual soft limit
// of 1024 would let the first starve the second. Best effort: failures leave the limit as it was.
// Returns the limits before and after, for the startup log.
OpenFileLimits RaiseOpenFileLimit();

// The resident size of process `pid` (this process by default), from /proc/PID/statm; 0 if
// unreadable.
int64_t ResidentBytes(int pid = 0);

// Descriptors held back from startup so that a server out of descriptors can still end cleanly:
// its fatal path releases them first. Logging to a file, shutting listeners down and, under the
// sanitizers, every first check of a type (UBSan probes memory through a pipe) may need one, and
// a server whose clients hold every descriptor would otherwise have none left for its own exit.
class DescriptorReserve {
 public:
  explicit DescriptorReserve(int count);  // opens /dev/null `count` times (fewer if refused)
  ~DescriptorReserve();
  DescriptorReserve(const DescriptorReserve&) = delete;
  DescriptorReserve& operator=(const DescriptorReserve&) = delete;

  int held() const;
  void Release();  // closes them; safe from any thread, more than once

 private:
  mutable std::mutex mu_;
  std::vector<int> fds_;
};

}  // namespace specula
