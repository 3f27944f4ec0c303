#include "engine/kv/counter_readback.h"

#include <cstring>

#include "engine/common/status_macros.h"

namespace specula {

absl::Status CounterReadback::Reserve(StepPlan& plan, size_t count) {
  slice_ = plan.Scratch<int64_t>(count);
  const size_t bytes = count * sizeof(int64_t);
  if (host_.bytes() < bytes) {
    ASSIGN_OR_RETURN(host_, backend_.AllocatePinnedHost(2 * bytes));
  }
  std::memset(host_.data(), 0, bytes);  // a step whose operations never ran reads zeros
  return absl::OkStatus();
}

void CounterReadback::Enqueue() {
  if (device_.empty()) return;
  const PageCopy copy{host_.data(), device_.data()};
  backend_.compute_stream().CopyPages(absl::MakeConstSpan(&copy, 1), device_.bytes());
}

}  // namespace specula
