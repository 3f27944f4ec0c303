// Runs the reactors' sends off the engine thread.
//
// The engine only queues a closure per stream with new output (no protobuf, no socket work);
// this thread drains the queue and starts the writes. It wakes at most once per batch of posts
// (one per engine step at steady state) and runs at normal priority on purpose: a send thread
// at idle priority measured slightly faster on a saturated 2-vCPU VM, but it can be preempted
// while it owns a connection's gRPC transport work, stalling every stream on that connection
// (docs/SERVING.md). Output that piles up while the thread is busy goes out coalesced.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class SendExecutor {
 public:
  SendExecutor();
  // Runs what is queued, then joins.
  ~SendExecutor();
  SendExecutor(const SendExecutor&) = delete;
  SendExecutor& operator=(const SendExecutor&) = delete;

  // Any thread; never blocks on the work itself. `task` must not block either.
  void Post(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable work_;
  std::vector<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace specula
