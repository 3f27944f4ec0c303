#include "server/send_executor.h"

#include <pthread.h>

#include <utility>

namespace specula {

SendExecutor::SendExecutor() : thread_([this] { Loop(); }) {}

SendExecutor::~SendExecutor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

void SendExecutor::Post(std::function<void()> task) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = queue_.empty();
    queue_.push_back(std::move(task));
  }
  // The thread takes the whole queue each time it wakes, so only the first post wakes it.
  if (first) work_.notify_one();
}

void SendExecutor::Loop() {
  pthread_setname_np(pthread_self(), "specula-send");
  std::vector<std::function<void()>> batch;
  std::unique_lock lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    batch.swap(queue_);
    lock.unlock();
    for (auto& task : batch) task();
    batch.clear();
    lock.lock();
  }
}

}  // namespace specula
