// Runs a task every `period` on a thread of its own, the first time one period after the start,
// until destroyed: the destructor ends the wait between runs at once and joins, so no run starts
// (or is still going) after it returns. The background loops of the server (the watchdog, the
// memory trimmer, the HTTP connection guard's sweeper) are each one of these.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace specula {

class PeriodicThread {
 public:
  PeriodicThread(absl::Duration period, std::function<void()> task);
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace specula
