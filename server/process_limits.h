// Process-wide resource limits the daemon adjusts at startup.
#pragma once

#include <cstdint>

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

}  // namespace specula
