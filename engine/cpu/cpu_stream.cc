#include "engine/cpu/cpu_stream.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/check.h"
#include "engine/common/fault_injection.h"
#include "engine/common/stopwatch.h"

namespace specula {
namespace {

// How much lower than its creator a copy stream's thread runs (nice value; 19 is the floor).
// On a GPU the copy engines are not the SMs; on the CPU backend a copy takes a core from the
// compute threads, and at normal priority waking the copy thread preempted one of them (the
// woken thread usually runs first) mid-attention. Lower, it fills cores the compute leaves idle
// (serial bookkeeping, host work between steps) and yields to them otherwise. It cannot starve:
// a copy that has not run is waited on (the engine thread then sleeps and frees a core) or read
// from the host store as a late page. Measured on a 2-vCPU VM (16K context, docs/BENCHMARKS.md):
// sparse steps 10-25% shorter, hit rates unchanged.
constexpr int kCopyThreadNiceIncrement = 10;

void LowerThisThreadsPriority(int increment) {
  // On Linux the nice value is per thread; raising it needs no privilege. Failing leaves the
  // thread at its creator's priority, which is correct, only slower.
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), std::min(19, current + increment));
}

}  // namespace

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
  done_at_ = MonotonicSeconds();
  cv_.notify_all();
}

std::optional<double> CpuEvent::SecondsSince(const Event& earlier) const {
  const auto* e = dynamic_cast<const CpuEvent*>(&earlier);
  CHECK(e != nullptr && e->timed_ && timed_) << "SecondsSince needs two timed CPU events";
  double from = 0;
  {
    std::lock_guard<std::mutex> lock(e->mu_);
    if (!e->done_) return std::nullopt;
    from = e->done_at_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return std::nullopt;
  return done_at_ - from;
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

std::shared_ptr<Event> CpuComputeStream::RecordTimed() {
  std::shared_ptr<CpuEvent> event =
      timed_.Next([this] { return std::make_shared<CpuEvent>(counters_, /*timed=*/true); });
  event->Complete();  // stamped now: what was enqueued before has run
  return event;
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

void CpuCopyStream::Enqueue(Work work) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_ == queue_.size()) {  // full: twice the room, oldest first
      std::vector<Work> grown(std::max<size_t>(16, 2 * queue_.size()));
      for (size_t i = 0; i < queued_; ++i) {
        grown[i] = std::move(queue_[(head_ + i) % queue_.size()]);
      }
      queue_ = std::move(grown);
      head_ = 0;
    }
    queue_[(head_ + queued_) % queue_.size()] = std::move(work);
    ++queued_;
    wake = idle_;
  }
  // Only an idle thread needs waking: a busy one finds the work when it looks at the queue. A
  // wake-up is a system call and, on a machine with few cores, often a context switch.
  if (wake) cv_.notify_one();
}

void CpuCopyStream::Loop() {
  LowerThisThreadsPriority(kCopyThreadNiceIncrement);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    idle_ = true;
    cv_.wait(lock, [&] { return stop_ || queued_ > 0; });
    idle_ = false;
    if (queued_ == 0) return;  // stopping, and everything enqueued has run
    Work work = std::move(queue_[head_]);
    head_ = (head_ + 1) % queue_.size();
    --queued_;
    lock.unlock();
    Run(work);
    lock.lock();
  }
}

void CpuCopyStream::Run(Work& work) {
  switch (work.kind) {
    case Work::Kind::kLaunch:
      if (BeginBatch()) work.launch();
      return;
    case Work::Kind::kCopy:
      if (BeginBatch()) CopyPagesNow(work.copies, work.page_bytes);
      return;
    case Work::Kind::kComplete:
      work.event->Complete();
      return;
    case Work::Kind::kWait:
      work.event->WaitUntilDone();
      return;
  }
}

bool CpuCopyStream::BeginBatch() {
  if (before_copy_) before_copy_();
  (void)SPECULA_FAULT(Fault::kSlowPageCopy);  // sleeps when armed
  return !FailedByFault();
}

void CpuCopyStream::CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) {
  Work work;
  work.kind = Work::Kind::kCopy;
  work.copies.assign(copies.begin(), copies.end());
  work.page_bytes = page_bytes;
  Enqueue(std::move(work));
}

void CpuCopyStream::Launch(InlineFunction launch) {
  Work work;
  work.launch = launch;
  Enqueue(std::move(work));
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
      events_.Next([this] { return std::make_shared<CpuEvent>(counters_, /*timed=*/true); });
  event->Rearm();
  Work work;
  work.kind = Work::Kind::kComplete;
  work.event = event;
  Enqueue(std::move(work));
  return event;
}

void CpuCopyStream::Wait(const std::shared_ptr<Event>& event) {
  Work work;
  work.kind = Work::Kind::kWait;
  work.event = std::dynamic_pointer_cast<CpuEvent>(event);
  CHECK(work.event != nullptr) << "a CPU stream can only wait on a CPU event";
  // Waiting on a completed event orders nothing: the compute stream's events are complete when
  // recorded, and queueing the wait would wake this stream's thread for nothing (a system call
  // and, on a machine with few cores, a context switch, once per layer of a sparse step).
  if (work.event->Done()) return;
  Enqueue(std::move(work));
}

void CpuCopyStream::Synchronize() { Record()->Synchronize(); }

}  // namespace specula
