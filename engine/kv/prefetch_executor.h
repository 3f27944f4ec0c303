// The dedicated prefetch executor (docs/ARCHITECTURE.md §4): its own threads take predicted page
// sets and stage the missing pages into device slots before decode needs them, each thread
// enqueuing batched gathers on its own copy stream. Submit never blocks
// the engine thread: when the queue is full the oldest prediction (the stalest) is dropped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend.h"

namespace specula {

class WorkingSet;

struct PrefetchTask {
  std::shared_ptr<WorkingSet> ws;
  int32_t layer = 0;
  uint64_t target_step = 0;  // the decode step the pages are predicted for
  // Either pages[kv_head] = predicted page indices (cross_step: already ranked by the engine),
  // or queries [num_heads * head_dim] the executor scores itself (cross_layer, prefill's last
  // row) against the candidates [sink_pages, candidate_end).
  std::vector<std::vector<int32_t>> pages;
  std::vector<float> queries;
  int32_t candidate_end = 0;
  double issued_seconds = 0;  // MonotonicSeconds() at Submit
  // For the step running now (cross_layer): served before predictions for the next step, which
  // would otherwise make it stale in the queue.
  bool urgent = false;
  int32_t staged_pages = 0;  // pages the task copied (set by the runner)
};

class PrefetchExecutor {
 public:
  using RunFn = std::function<void(PrefetchTask& task, Stream& copy_stream)>;

  // Starts `threads` threads, each with its own copy stream from `backend`.
  PrefetchExecutor(int32_t threads, size_t max_queued, Backend& backend, RunFn run);
  ~PrefetchExecutor();  // drops what is queued, waits for running tasks
  PrefetchExecutor(const PrefetchExecutor&) = delete;
  PrefetchExecutor& operator=(const PrefetchExecutor&) = delete;

  void Submit(PrefetchTask task);
  // Blocks until the queue is empty and no task runs (tests and benchmarks).
  void WaitIdle();
  int64_t dropped() const;

 private:
  void Loop(Stream* stream);

  RunFn run_;
  size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrived or stopping
  std::condition_variable idle_cv_;  // a task ended
  std::deque<PrefetchTask> queue_;   // for the next step
  std::deque<PrefetchTask> urgent_;  // for the running step; served first
  int32_t running_ = 0;
  int64_t dropped_ = 0;
  bool stop_ = false;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::thread> threads_;
};

double MonotonicSeconds();

}  // namespace specula
