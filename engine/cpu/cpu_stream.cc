#include "engine/cpu/cpu_stream.h"

#include <cstring>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/check.h"
#include "engine/common/fault_injection.h"

namespace specula {

void CopyPagesNow(absl::Span<const PageCopy> copies, size_t page_bytes) {
  for (const PageCopy& c : copies) std::memcpy(c.dst, c.src, page_bytes);
}

bool CpuEvent::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CpuEvent::Synchronize() {
  if (counters_ != nullptr) ++counters_->host_syncs;
  WaitUntilDone();
}

void CpuEvent::WaitUntilDone() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

void CpuEvent::Rearm() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = false;
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
    : counters_(counters), done_(std::make_shared<CpuEvent>(counters)) {
  done_->Complete();
}

std::shared_ptr<Event> CpuComputeStream::Record() {
  return done_;  // everything enqueued has run already
}

void CpuComputeStream::Wait(const std::shared_ptr<Event>& event) {
  // The caller is this stream's executor: later work must not run before the event.
  const auto* cpu_event = dynamic_cast<const CpuEvent*>(event.get());
  CHECK(cpu_event != nullptr) << "a CPU stream can only wait on a CPU event";
  cpu_event->WaitUntilDone();
}

void CpuComputeStream::Synchronize() {
  ++counters_->host_syncs;
  (void)SPECULA_FAULT(Fault::kSlowDevice);  // sleeps when armed
}

CpuCopyStream::CpuCopyStream(BackendCounters* counters, std::function<void()> before_copy)
    : counters_(counters), before_copy_(std::move(before_copy)), thread_([this] { Loop(); }) {}

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
    (void)SPECULA_FAULT(Fault::kSlowPageCopy);  // sleeps when armed
    if (FailedByFault()) return;
    CopyPagesNow(list, page_bytes);
  });
}

void CpuCopyStream::Launch(std::function<void()> work) {
  Enqueue([this, work = std::move(work)] {
    if (before_copy_) before_copy_();
    (void)SPECULA_FAULT(Fault::kSlowPageCopy);
    if (FailedByFault()) return;
    work();
  });
}

bool CpuCopyStream::FailedByFault() {
  if (!SPECULA_FAULT(Fault::kFailPageCopy)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = absl::InternalError("a batched page copy failed (injected fault)");
  return true;
}

absl::Status CpuCopyStream::TakeError() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, absl::OkStatus());
}

std::shared_ptr<Event> CpuCopyStream::Record() {
  std::shared_ptr<CpuEvent> event =
      events_.Next([this] { return std::make_shared<CpuEvent>(counters_); });
  event->Rearm();
  Enqueue([event] { event->Complete(); });
  return event;
}

void CpuCopyStream::Wait(const std::shared_ptr<Event>& event) {
  std::shared_ptr<const CpuEvent> cpu_event = std::dynamic_pointer_cast<const CpuEvent>(event);
  CHECK(cpu_event != nullptr) << "a CPU stream can only wait on a CPU event";
  Enqueue([cpu_event] { cpu_event->WaitUntilDone(); });
}

void CpuCopyStream::Synchronize() { Record()->Synchronize(); }

}  // namespace specula
