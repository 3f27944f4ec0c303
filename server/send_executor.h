// Runs the reactors' sends off the engine thread.
//
// The engine only queues a closure per stream with new output (no protobuf, no socket work).
// By default (`server.send_priority: idle`) a SCHED_IDLE worker runs the queue: sends then fill
// the CPU time the forward pass leaves instead of preempting it, and output that piles up
// meanwhile goes out coalesced (fewer, larger messages: less CPU per token). On the 2-vCPU dev
// VM at 64 streams this is the difference between ~0.8 and ~0.9 of the engine's own tokens/s
// (docs/BENCHMARKS.md). A normal-priority fallback thread runs any task that waited longer than
// `max_delay`, task by task, so an engine saturating every core delays delivery by at most that
// much (plus a send already started by the worker). `normal` runs the worker at normal
// priority: no scheduling games, more CPU per token.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "server/send_priority.h"

namespace specula {

class SendExecutor {
 public:
  using Priority = SendPriority;
  // `worker` false leaves only the fallback thread (tests of the delay bound).
  explicit SendExecutor(Priority priority = Priority::kIdle,
                        absl::Duration max_delay = absl::Milliseconds(20), bool worker = true);
  // Runs what is queued, then joins.
  ~SendExecutor();
  SendExecutor(const SendExecutor&) = delete;
  SendExecutor& operator=(const SendExecutor&) = delete;

  // Any thread; never blocks on the work itself. Tasks may run concurrently with each other
  // (on the two threads) and must be safe for that; they must not block.
  void Post(std::function<void()> task);

  // Tasks the fallback ran because they had waited longer than max_delay.
  int64_t fallback_tasks() const;

 private:
  struct Task {
    std::function<void()> run;
    absl::Time posted;
  };
  void WorkerLoop(Priority priority);
  void FallbackLoop();

  const absl::Duration max_delay_;
  mutable std::mutex mu_;
  std::condition_variable work_;      // worker: the queue became non-empty, or stopping
  std::condition_variable fallback_;  // fallback: the queue became non-empty, or stopping
  std::deque<Task> queue_;
  int64_t fallback_tasks_ = 0;
  bool stop_ = false;
  std::thread worker_;
  std::thread fallback_thread_;
};

}  // namespace specula
