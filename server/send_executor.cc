#include "server/send_executor.h"

#include <pthread.h>
#include <sched.h>

#include <utility>

#include "engine/common/log.h"

namespace specula {

SendExecutor::SendExecutor(Priority priority, absl::Duration max_delay, bool worker)
    : max_delay_(max_delay), fallback_thread_([this] { FallbackLoop(); }) {
  if (worker) worker_ = std::thread([this, priority] { WorkerLoop(priority); });
}

SendExecutor::~SendExecutor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  fallback_.notify_all();
  if (worker_.joinable()) worker_.join();
  fallback_thread_.join();
}

void SendExecutor::Post(std::function<void()> task) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = queue_.empty();
    queue_.push_back({std::move(task), absl::Now()});
  }
  // Whoever drains the queue takes everything in it, so only the first post wakes anyone.
  if (first) {
    work_.notify_one();
    fallback_.notify_one();
  }
}

int64_t SendExecutor::fallback_tasks() const {
  std::lock_guard lock(mu_);
  return fallback_tasks_;
}

void SendExecutor::WorkerLoop(Priority priority) {
  pthread_setname_np(pthread_self(), "specula-send");
  if (priority == Priority::kIdle) {
    sched_param param{};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) != 0) {
      Log(LogLevel::kWarning, "send_priority_unavailable",
          {{"wanted", "idle"}, {"running_at", "normal"}});
    }
  }
  std::unique_lock lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // the fallback thread finishes the queue
    // One task at a time, so the fallback can take the rest if this thread loses its CPU.
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task.run();
    lock.lock();
  }
}

void SendExecutor::FallbackLoop() {
  pthread_setname_np(pthread_self(), "specula-sendfb");
  std::unique_lock lock(mu_);
  while (true) {
    fallback_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (!stop_) {
      const absl::Time due = queue_.front().posted + max_delay_;
      if (absl::Now() < due) {
        // Woken early only by stop; a Post to a non-empty queue does not notify.
        fallback_.wait_until(lock, absl::ToChronoTime(due), [&] { return stop_; });
        continue;
      }
    }
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (!stop_) ++fallback_tasks_;
    lock.unlock();
    task.run();
    lock.lock();
  }
}

}  // namespace specula
