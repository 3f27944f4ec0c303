// A delayed copy stream for tests: a CPU backend whose copy streams (the prefetch executor's) can
// be held at a gate. A held copy has claimed its slots already (the pages are mapped and
// loading, their event not done); it reports that it started, then waits until the gate opens or
// `hold_limit` passes, and only then copies. So a test can make a prefetch
// exactly as late as it wants, and know when it is in flight instead of sleeping and hoping.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_stream.h"

namespace specula::testing {

class CopyGate {
 public:
  // Holds every later copy made off the creating thread, each for at most `hold_limit`.
  void Close(std::chrono::milliseconds hold_limit) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    hold_limit_ = hold_limit;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  // Waits (at most `timeout`) until `n` copies have been held since construction.
  bool WaitForHeld(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return held_ >= n; });
  }
  int held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  // Called by every copy before it moves bytes.
  void Enter() {
    if (std::this_thread::get_id() == owner_) return;
    std::unique_lock<std::mutex> lock(mu_);
    if (!closed_) return;
    ++held_;
    cv_.notify_all();
    cv_.wait_for(lock, hold_limit_, [&] { return !closed_; });
  }

 private:
  const std::thread::id owner_ = std::this_thread::get_id();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::chrono::milliseconds hold_limit_{0};
  int held_ = 0;
};

class GatedCopyBackend : public CpuBackend {
 public:
  GatedCopyBackend() : CpuBackend(1) {}
  CopyGate& gate() { return gate_; }
  // Copy streams (the prefetch executor's) pass every batched copy through the gate.
  std::unique_ptr<Stream> CreateStream() override {
    return MakeCopyStream([this] { gate_.Enter(); });
  }

 private:
  CopyGate gate_;
};

}  // namespace specula::testing
