// Returns the heap's free pages to the kernel every `period`. glibc keeps memory freed by a burst
// of connections in its arenas for reuse, and gRPC keeps a ~72-byte descriptor object per peak
// connection alive (its free list), one on many of those pages, so free() alone gives none of it
// back: 20,000 idle gRPC connections that came and went left the resident size 250 MB above its
// level before them. malloc_trim(0) releases every whole free page (measured, docs/SERVING.md).
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "server/periodic_thread.h"

namespace specula {

class MemoryTrimmer {
 public:
  explicit MemoryTrimmer(absl::Duration period);

  // Trims done so far (tests wait on it rather than on time).
  uint64_t trims() const;

 private:
  void Trim();

  std::atomic<uint64_t> trims_ = 0;
  PeriodicThread thread_;  // last: stopped before the rest goes
};

}  // namespace specula
