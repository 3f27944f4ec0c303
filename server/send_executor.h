// Runs the reactors' sends off the engine thread, in the CPU time the engine leaves idle.
//
// The engine thread only queues a closure per stream with new output (no protobuf, no socket).
// A worker thread at SCHED_IDLE priority drains the queue: on a machine the engine keeps busy,
// sends happen in its gaps instead of preempting the forward pass, and output that piles up
// meanwhile goes out coalesced (fewer, larger messages: less CPU per token). Measured on the
// 2-vCPU dev VM at 64 streams: served/engine tokens/s rose from ~0.75 to ~0.9-1.0
// (docs/BENCHMARKS.md). So that an engine saturating every core cannot starve delivery, a
// normal-priority fallback thread runs whatever has waited longer than `max_delay`.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace specula {

class SendExecutor {
 public:
  // `idle_worker` false leaves only the fallback thread (tests of the starvation guard).
  explicit SendExecutor(absl::Duration max_delay = absl::Milliseconds(5), bool idle_worker = true);
  // Runs what is queued, then joins.
  ~SendExecutor();
  SendExecutor(const SendExecutor&) = delete;
  SendExecutor& operator=(const SendExecutor&) = delete;

  // Any thread; never blocks on the work itself. `task` must not block either.
  void Post(std::function<void()> task);

  // Batches run by the fallback because the idle-priority worker had not run them in time.
  int64_t fallback_batches() const;
  // Whether the worker got SCHED_IDLE (it runs at normal priority where that is refused).
  bool idle_priority() const;

 private:
  void IdleLoop();
  void FallbackLoop();
  // Runs the queued batch if there is one (under `lock`, released while running).
  void RunBatch(std::unique_lock<std::mutex>& lock);

  const absl::Duration max_delay_;
  mutable std::mutex mu_;
  std::condition_variable work_;      // idle worker: queue became non-empty
  std::condition_variable fallback_;  // fallback: queue became non-empty, or stopping
  std::vector<std::function<void()>> queue_;
  std::vector<std::function<void()>> batch_;  // being run (by either thread)
  uint64_t batches_taken_ = 0;
  int64_t fallback_batches_ = 0;
  bool running_batch_ = false;
  bool idle_priority_ = false;
  bool stop_ = false;
  std::thread idle_thread_;
  std::thread fallback_thread_;
};

}  // namespace specula
