// A few worker threads that run posted tasks in order: CPU work a gRPC callback must not do on
// gRPC's own threads (tokenizing a long prompt), so those threads stay free for other calls.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace specula {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  // Runs every task still queued, then joins.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task` unless `max_outstanding` tasks are already queued or running, or the queue is
  // closed; false then. Any thread; returns at once. Tasks run in posting order, up to `threads`
  // at a time.
  bool TryPost(std::function<void()> task, size_t max_outstanding);
  // Refuses every later TryPost; what is queued still runs.
  void Close();
  bool closed() const;

  // Tasks queued or running.
  size_t outstanding() const;
  // Waits until no task is queued or running; false if `deadline` passed first.
  bool WaitIdle(absl::Time deadline);

  // While paused, workers start no task (tests hold tasks in the queue with it).
  void SetPausedForTesting(bool paused);

 private:
  void WorkerLoop();

  mutable std::mutex mu_;
  std::condition_variable ready_;  // a task or stopping_ for the workers
  std::condition_variable idle_;   // outstanding() reached 0
  std::deque<std::function<void()>> tasks_;
  size_t running_ = 0;
  bool paused_ = false;
  bool closed_ = false;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace specula
