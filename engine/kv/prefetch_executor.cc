#include "engine/kv/prefetch_executor.h"

#include <chrono>

#include "engine/kv/working_set.h"

namespace specula {

double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

PrefetchExecutor::PrefetchExecutor(int32_t threads, size_t max_queued, Backend& backend,
                                   RunFn run)
    : run_(std::move(run)), max_queued_(max_queued) {
  for (int32_t i = 0; i < threads; ++i) streams_.push_back(backend.CreateStream());
  for (int32_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, c = streams_[i].get()] { Loop(c); });
  }
}

PrefetchExecutor::~PrefetchExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
    urgent_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void PrefetchExecutor::Submit(PrefetchTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<PrefetchTask>& q = task.urgent ? urgent_ : queue_;
    if (q.size() >= max_queued_) {
      q.pop_front();
      ++dropped_;
    }
    q.push_back(std::move(task));
  }
  cv_.notify_one();
}

void PrefetchExecutor::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && urgent_.empty() && running_ == 0; });
}

int64_t PrefetchExecutor::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void PrefetchExecutor::Loop(Stream* stream) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !urgent_.empty(); });
    if (stop_) return;
    std::deque<PrefetchTask>& q = urgent_.empty() ? queue_ : urgent_;
    PrefetchTask task = std::move(q.front());
    q.pop_front();
    ++running_;
    lock.unlock();
    run_(task, *stream);
    task = PrefetchTask();  // drop the working-set reference outside the lock
    lock.lock();
    --running_;
    idle_cv_.notify_all();
  }
}

}  // namespace specula
