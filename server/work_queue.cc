#include "server/work_queue.h"

#include <utility>

namespace specula {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    paused_ = false;
  }
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool WorkQueue::TryPost(std::function<void()> task, size_t max_outstanding) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || tasks_.size() + running_ >= max_outstanding) return false;
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
  return true;
}

void WorkQueue::Close() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

bool WorkQueue::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

size_t WorkQueue::outstanding() const {
  std::lock_guard lock(mu_);
  return tasks_.size() + running_;
}

bool WorkQueue::WaitIdle(absl::Time deadline) {
  std::unique_lock lock(mu_);
  return idle_.wait_until(lock, absl::ToChronoTime(deadline),
                          [this] { return tasks_.empty() && running_ == 0; });
}

void WorkQueue::SetPausedForTesting(bool paused) {
  {
    std::lock_guard lock(mu_);
    paused_ = paused;
  }
  ready_.notify_all();
}

void WorkQueue::WorkerLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    ready_.wait(lock, [this] { return stopping_ || (!paused_ && !tasks_.empty()); });
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    ++running_;
    lock.unlock();
    task();
    task = nullptr;  // what it captured (a call, its prompt) is released outside the lock
    lock.lock();
    --running_;
    if (tasks_.empty() && running_ == 0) idle_.notify_all();
  }
}

}  // namespace specula
