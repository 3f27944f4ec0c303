#include "server/memory_trimmer.h"

#include <malloc.h>

#include "engine/common/log.h"
#include "server/process_limits.h"

namespace specula {
namespace {

// Only a trim that gave back this much is logged (at debug level): most give back nothing.
constexpr int64_t kLoggedReleaseBytes = int64_t{1} << 20;

}  // namespace

MemoryTrimmer::MemoryTrimmer(absl::Duration period) : thread_([this, period] { Loop(period); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

uint64_t MemoryTrimmer::trims() const {
  std::lock_guard lock(mu_);
  return trims_;
}

void MemoryTrimmer::Loop(absl::Duration period) {
  std::unique_lock lock(mu_);
  while (!wake_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stop_; })) {
    lock.unlock();
    const int64_t before = ResidentBytes();
    const absl::Time start = absl::Now();
    malloc_trim(0);
    const int64_t released = before - ResidentBytes();
    if (released >= kLoggedReleaseBytes) {
      Log(LogLevel::kDebug, "memory_trimmed",
          {{"released_mb", static_cast<double>(released) / (1 << 20)},
           {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
    }
    lock.lock();
    ++trims_;
  }
}

}  // namespace specula
