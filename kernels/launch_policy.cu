#include <atomic>

#include "kernels/launch_policy.h"

namespace specula::kernels {
namespace {

std::atomic<bool> dependent_launches{true};

}  // namespace

void SetDependentLaunches(bool enabled) { dependent_launches.store(enabled); }

bool DependentLaunches() { return dependent_launches.load(std::memory_order_relaxed); }

}  // namespace specula::kernels
