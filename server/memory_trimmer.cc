#include "server/memory_trimmer.h"

#include <malloc.h>

#include "engine/common/log.h"
#include "server/process_limits.h"

namespace specula {
namespace {

// Only a trim that gave back this much is logged (at debug level): most give back nothing.
constexpr int64_t kLoggedReleaseBytes = int64_t{1} << 20;

}  // namespace

MemoryTrimmer::MemoryTrimmer(absl::Duration period) : thread_(period, [this] { Trim(); }) {}

uint64_t MemoryTrimmer::trims() const { return trims_.load(); }

void MemoryTrimmer::Trim() {
  const int64_t before = ResidentBytes();
  const absl::Time start = absl::Now();
  malloc_trim(0);
  const int64_t released = before - ResidentBytes();
  if (released >= kLoggedReleaseBytes) {
    Log(LogLevel::kDebug, "memory_trimmed",
        {{"released_mb", static_cast<double>(released) / (1 << 20)},
         {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
  }
  ++trims_;
}

}  // namespace specula
