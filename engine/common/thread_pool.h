// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace specula {

class ThreadPool {
 public:
  // `num_threads` workers in total, counting the caller of ParallelFor (which works too);
  // 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel, and returns when all
  // are done. At most ⌈n / min_chunk⌉ ranges (and one per thread), so a loop of at most
  // min_chunk items stays on one thread; a range may hold fewer than min_chunk items.
  // Not reentrant: one ParallelFor at a time per pool (the engine thread owns it). `fn` is taken
  // by reference, never copied: a lambda with many captures costs no allocation per call.
  void ParallelFor(int64_t n, int64_t min_chunk, absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const absl::FunctionRef<void(int64_t, int64_t)>* job_ = nullptr;  // ParallelFor's argument
  int64_t job_n_ = 0;
  int64_t job_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace specula
