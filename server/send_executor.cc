#include "server/send_executor.h"

#include <pthread.h>
#include <sched.h>

#include <utility>

#include "engine/common/log.h"

namespace specula {

SendExecutor::SendExecutor(absl::Duration max_delay, bool idle_worker)
    : max_delay_(max_delay), fallback_thread_([this] { FallbackLoop(); }) {
  if (idle_worker) idle_thread_ = std::thread([this] { IdleLoop(); });
}

SendExecutor::~SendExecutor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  fallback_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
  fallback_thread_.join();
}

void SendExecutor::Post(std::function<void()> task) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = queue_.empty();
    queue_.push_back(std::move(task));
  }
  // Whoever runs the queue takes all of it, so only the first post of a batch wakes anyone.
  if (first) {
    work_.notify_one();
    fallback_.notify_one();
  }
}

bool SendExecutor::idle_priority() const {
  std::lock_guard lock(mu_);
  return idle_priority_;
}

int64_t SendExecutor::fallback_batches() const {
  std::lock_guard lock(mu_);
  return fallback_batches_;
}

void SendExecutor::RunBatch(std::unique_lock<std::mutex>& lock) {
  // One batch at a time keeps each stream's sends in order.
  if (queue_.empty() || running_batch_) return;
  running_batch_ = true;
  batch_.swap(queue_);
  ++batches_taken_;
  lock.unlock();
  for (auto& task : batch_) task();
  batch_.clear();
  lock.lock();
  running_batch_ = false;
  // Posts that arrived meanwhile spent their wake-up on a busy runner.
  if (!queue_.empty()) work_.notify_one();
}

void SendExecutor::IdleLoop() {
  pthread_setname_np(pthread_self(), "specula-send");
  sched_param param{};
  const bool idle = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) == 0;
  if (!idle) Log(LogLevel::kDebug, "send_thread_priority", {{"sched_idle", false}});
  std::unique_lock lock(mu_);
  idle_priority_ = idle;
  while (true) {
    work_.wait(lock, [&] { return stop_ || (!queue_.empty() && !running_batch_); });
    if (stop_) return;  // the fallback thread finishes the queue
    RunBatch(lock);
  }
}

void SendExecutor::FallbackLoop() {
  pthread_setname_np(pthread_self(), "specula-sendfb");
  std::unique_lock lock(mu_);
  while (true) {
    fallback_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) {
      // The idle worker may never get a CPU again; finish the queue here.
      while (!queue_.empty() || running_batch_) {
        if (running_batch_) {
          lock.unlock();
          std::this_thread::yield();
          lock.lock();
          continue;
        }
        RunBatch(lock);
      }
      return;
    }
    const uint64_t seen = batches_taken_;
    const bool taken = fallback_.wait_for(lock, absl::ToChronoNanoseconds(max_delay_),
                                          [&] { return stop_ || batches_taken_ != seen; });
    if (taken || stop_) continue;
    ++fallback_batches_;
    RunBatch(lock);
  }
}

}  // namespace specula
