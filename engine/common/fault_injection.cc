#include "engine/common/fault_injection.h"

#ifdef SPECULA_FAULT_INJECTION

#include <array>
#include <atomic>
#include <mutex>

#include "absl/time/clock.h"

namespace specula {
namespace {

struct Armed {
  std::mutex mu;
  std::array<int, kFaults> times{};
  std::array<absl::Duration, kFaults> delay{};
  std::atomic<bool> any{false};  // the fast path: nothing armed, no lock
};

Armed& State() {
  static Armed* armed = new Armed();
  return *armed;
}

}  // namespace

void ArmFault(Fault fault, int times, absl::Duration delay) {
  Armed& a = State();
  std::lock_guard lock(a.mu);
  a.times[static_cast<int>(fault)] = times;
  a.delay[static_cast<int>(fault)] = delay;
  a.any.store(true);
}

void DisarmFaults() {
  Armed& a = State();
  std::lock_guard lock(a.mu);
  a.times.fill(0);
  a.any.store(false);
}

bool HitFault(Fault fault) {
  Armed& a = State();
  if (!a.any.load(std::memory_order_relaxed)) return false;
  absl::Duration delay;
  {
    std::lock_guard lock(a.mu);
    int& left = a.times[static_cast<int>(fault)];
    if (left <= 0) return false;
    --left;
    delay = a.delay[static_cast<int>(fault)];
  }
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
  return true;
}

}  // namespace specula

#endif  // SPECULA_FAULT_INJECTION
