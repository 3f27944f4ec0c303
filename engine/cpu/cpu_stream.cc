#include "engine/cpu/cpu_stream.h"

#include <cstring>
#include <vector>

#include "engine/backend.h"

namespace specula {

void CopyPagesNow(absl::Span<const PageCopy> copies, size_t page_bytes) {
  for (const PageCopy& c : copies) std::memcpy(c.dst, c.src, page_bytes);
}

bool CpuEvent::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CpuEvent::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

void CpuEvent::Complete() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

void CpuComputeStream::CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) {
  CopyPagesNow(copies, page_bytes);
}

CpuComputeStream::CpuComputeStream(BackendCounters* counters)
    : counters_(counters), done_(std::make_shared<CpuEvent>()) {
  done_->Complete();
}

std::shared_ptr<Event> CpuComputeStream::Record() {
  return done_;  // everything enqueued has run already
}

void CpuComputeStream::Wait(const std::shared_ptr<Event>& event) {
  // The caller is this stream's executor: later work must not run before the event.
  event->Synchronize();
}

void CpuComputeStream::Synchronize() { ++counters_->compute_syncs; }

CpuCopyStream::CpuCopyStream(std::function<void()> before_copy)
    : before_copy_(std::move(before_copy)), thread_([this] { Loop(); }) {}

CpuCopyStream::~CpuCopyStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CpuCopyStream::Enqueue(std::function<void()> work) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    wake = idle_;
  }
  // Only an idle thread needs waking: a busy one finds the work when it looks at the queue. A
  // wake-up is a system call and, on a machine with few cores, often a context switch.
  if (wake) cv_.notify_one();
}

void CpuCopyStream::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    idle_ = true;
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    idle_ = false;
    if (queue_.empty()) return;  // stopping, and everything enqueued has run
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    work();
    lock.lock();
  }
}

void CpuCopyStream::CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) {
  Enqueue([this, list = std::vector<PageCopy>(copies.begin(), copies.end()), page_bytes] {
    if (before_copy_) before_copy_();
    CopyPagesNow(list, page_bytes);
  });
}

void CpuCopyStream::Launch(std::function<void()> work) {
  Enqueue([this, work = std::move(work)] {
    if (before_copy_) before_copy_();
    work();
  });
}

std::shared_ptr<Event> CpuCopyStream::Record() {
  auto event = std::make_shared<CpuEvent>();
  Enqueue([event] { event->Complete(); });
  return event;
}

void CpuCopyStream::Wait(const std::shared_ptr<Event>& event) {
  Enqueue([event] { event->Synchronize(); });
}

void CpuCopyStream::Synchronize() { Record()->Synchronize(); }

}  // namespace specula
