#include "engine/common/thread_pool.h"

#include <algorithm>

namespace specula {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t chunks = std::min<int64_t>(num_threads(), (n + min_chunk - 1) / min_chunk);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  auto run_chunk = [&](int64_t c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    fn(begin, end);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    next_chunk_ = 1;  // chunk 0 is the caller's
    chunks_done_ = 0;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunk(0);
  std::unique_lock<std::mutex> lock(mu_);
  // The caller helps with chunks no worker has picked up yet.
  while (next_chunk_ < job_chunks_) {
    const int64_t c = next_chunk_++;
    lock.unlock();
    run_chunk(c);
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == job_chunks_ - 1; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      const int64_t c = next_chunk_++;
      const auto* fn = job_;
      const int64_t n = job_n_, chunks = job_chunks_;
      lock.unlock();
      (*fn)(n * c / chunks, n * (c + 1) / chunks);
      lock.lock();
      if (++chunks_done_ == job_chunks_ - 1) done_cv_.notify_all();
    }
  }
}

}  // namespace specula
