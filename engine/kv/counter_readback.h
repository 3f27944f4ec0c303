// Counters that device operations add to during a step (engine/backend/sparse_ops.h's
// SparseCounter), read back without a synchronization of their own: the copy into pinned host
// memory is enqueued before the step's one readback and has landed when that returns.
//
// Per step: Reserve (before the plan's upload; zeroed by it), Bind, operations add to Device(),
// Enqueue after the last of them, then Host() after the step's synchronization.
// Engine thread only.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "kernels/sparse_abi.h"

namespace specula {

// Adds one (row, KV head)'s counters `c` ([kSparseCounterCount], SparseCounter order) to a
// request's KvStats or a step's SparseStepStats (the same fields).
template <typename Stats>
void AddSparseCounters(const int64_t* c, int64_t page_bytes, Stats* s) {
  s->pages_hit += c[kCounterHit];
  s->pages_late += c[kCounterLate];
  s->pages_missed += c[kCounterMissed];
  s->pages_corrected += c[kCounterCorrected];
  s->bytes_fetched += c[kCounterFetched] * page_bytes;
  s->bytes_prefetched += c[kCounterStaged] * page_bytes;
}

class CounterReadback {
 public:
  explicit CounterReadback(Backend& backend) : backend_(backend) {}

  absl::Status Reserve(StepPlan& plan, size_t count);
  void Bind(const StepPlan& plan) { device_ = plan.Device(slice_); }
  DeviceSpan<int64_t> Device() const { return device_; }
  void Enqueue();
  // The counters as of Enqueue, valid after the step's synchronization.
  const int64_t* Host() const { return host_.as<const int64_t>(); }
  size_t size() const { return slice_.count; }

 private:
  Backend& backend_;
  PlanSlice<int64_t> slice_;
  DeviceSpan<int64_t> device_;
  DeviceBuffer host_;  // pinned
};

}  // namespace specula
