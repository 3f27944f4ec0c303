// The CPU backend's streams and events (semantics in engine/backend/stream.h).
// - CpuEvent: a flag set when its stream reaches it, with the time it was set (a timed event's
//   SecondsSince). Its Synchronize is a host synchronization and is counted; a stream waiting on
//   it is not.
// - CpuComputeStream: the engine thread is the executor of the compute stream, so work runs at
//   enqueue time, which is one legal schedule of an in-order stream. Wait(event) therefore blocks
//   the caller until the event is done: compute never runs ahead of a copy it was ordered after.
// - CpuCopyStream: an in-order queue run by its own thread, truly asynchronous to the enqueuing
//   thread, so a test can delay it and tell a missing Wait.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend/event_ring.h"
#include "engine/backend/stream.h"
#include "engine/common/inline_function.h"

namespace specula {

struct BackendCounters;

class CpuEvent : public Event {
 public:
  // Synchronize counts in `counters` (the backend's; may be null; must outlive the event).
  // `timed`: from RecordTimed, so SecondsSince may read it (as a CUDA timing event).
  explicit CpuEvent(BackendCounters* counters, bool timed = false)
      : counters_(counters), timed_(timed) {}
  bool Done() const override;
  void Synchronize() override;
  std::optional<double> SecondsSince(const Event& earlier) const override;
  // A stream's wait: blocks its executor until done, uncounted.
  void WaitUntilDone() const;
  void Complete();
  // Marks it not done again, to be recorded anew (EventRing).
  void Rearm();

 private:
  BackendCounters* counters_;
  const bool timed_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  double done_at_ = 0;  // steady_clock seconds at Complete
};

class CpuComputeStream : public Stream {
 public:
  // Counts Synchronize calls in `counters` (the backend's; must outlive the stream).
  explicit CpuComputeStream(BackendCounters* counters);
  void CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) override;
  std::shared_ptr<Event> Record() override;
  // A completed event stamped now (the stream's work has run at enqueue).
  std::shared_ptr<Event> RecordTimed() override;
  void Wait(const std::shared_ptr<Event>& event) override;
  void Synchronize() override;

 private:
  BackendCounters* counters_;
  // What Record returns: one completed event, so a decode layer's Record does not allocate.
  std::shared_ptr<CpuEvent> done_;
  EventRing<CpuEvent> timed_;  // RecordTimed's, reused
};

class CpuCopyStream : public Stream {
 public:
  // `before_copy`, if set, runs on the stream's thread before each batched copy (tests use it
  // to hold a copy in flight). Host synchronizations count in `counters` (may be null).
  explicit CpuCopyStream(BackendCounters* counters = nullptr,
                         std::function<void()> before_copy = nullptr);
  ~CpuCopyStream() override;  // finishes what is enqueued, like destroying a CUDA stream
  CpuCopyStream(const CpuCopyStream&) = delete;
  CpuCopyStream& operator=(const CpuCopyStream&) = delete;

  void CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) override;
  std::shared_ptr<Event> Record() override;
  // Every event of this stream is timed: stamped when the stream's thread completes it.
  std::shared_ptr<Event> RecordTimed() override { return Record(); }
  void Wait(const std::shared_ptr<Event>& event) override;
  void Synchronize() override;
  absl::Status TakeError() override;
  // Enqueues a kernel-like function that moves pages (GatherPages): it runs on the stream's
  // thread in order, after `before_copy`, like CopyPages. Enqueuing it allocates nothing.
  void Launch(InlineFunction work);

 private:
  // An item of the queue. Launches, records and waits, enqueued every decode step, allocate
  // nothing (an InlineFunction, a shared event); a CopyPages batch owns its list.
  struct Work {
    enum class Kind { kLaunch, kCopy, kComplete, kWait };
    Kind kind = Kind::kLaunch;
    InlineFunction launch;             // kLaunch
    std::vector<PageCopy> copies;      // kCopy
    size_t page_bytes = 0;             // kCopy
    std::shared_ptr<CpuEvent> event;   // kComplete: completes it; kWait: waits for it
  };
  void Enqueue(Work work);
  void Run(Work& work);
  // A batch of pages moves (a copy or a launch): `before_copy` first, and the fault points.
  bool BeginBatch();
  void Loop();
  // Whether an armed kFailPageCopy fails this batch: the batch is skipped (as a failed
  // cudaMemcpyBatchAsync copies nothing it could be trusted with) and the error kept.
  bool FailedByFault();

  BackendCounters* counters_;
  std::function<void()> before_copy_;
  EventRing<CpuEvent> events_;  // engine thread (Record)
  std::mutex mu_;
  std::condition_variable cv_;
  // A ring (guarded by mu_): queue_[head_] is the oldest of `queued_` items. It grows by
  // doubling and never shrinks, so a steady step's items reuse its slots.
  std::vector<Work> queue_;
  size_t head_ = 0;
  size_t queued_ = 0;
  bool stop_ = false;
  bool idle_ = false;   // the thread waits for work (guarded by mu_)
  absl::Status error_;  // the first failure since TakeError (guarded by mu_)
  std::thread thread_;  // last: starts once the members above exist
};

// Copies each page of a batch (the one definition both stream kinds use).
void CopyPagesNow(absl::Span<const PageCopy> copies, size_t page_bytes);

}  // namespace specula
