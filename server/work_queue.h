// A few worker threads that run posted tasks in order: CPU work a gRPC callback must not do on
// gRPC's own threads (tokenizing a long prompt), so those threads stay free for other calls.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  // Runs every task still queued, then joins.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Any thread; returns at once. Tasks run in posting order, up to `threads` at a time.
  void Post(std::function<void()> task);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace specula
