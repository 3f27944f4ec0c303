#include "server/periodic_thread.h"

#include <utility>

namespace specula {

PeriodicThread::PeriodicThread(absl::Duration period, std::function<void()> task)
    : thread_([this, period, task = std::move(task)] {
        std::unique_lock lock(mu_);
        while (!wake_.wait_for(lock, absl::ToChronoNanoseconds(period), [this] { return stop_; })) {
          lock.unlock();  // the task runs unlocked: the destructor can ask to stop meanwhile
          task();
          lock.lock();
        }
      }) {}

PeriodicThread::~PeriodicThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace specula
