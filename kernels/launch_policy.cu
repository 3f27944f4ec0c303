#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/launch_policy.h"

namespace specula::kernels {
namespace {

std::atomic<bool> dependent_launches{true};

bool TurnedOffByEnvironment() {
  static const bool off = [] {
    const char* v = std::getenv("SPECULA_DEPENDENT_LAUNCHES");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  return off;
}

}  // namespace

void SetDependentLaunches(bool enabled) { dependent_launches.store(enabled); }

bool DependentLaunches() {
  return dependent_launches.load(std::memory_order_relaxed) && !TurnedOffByEnvironment();
}

}  // namespace specula::kernels
