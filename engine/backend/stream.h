// Streams and events, with CUDA's semantics, so the engine orders copies against compute the same
// way on every backend:
// - A Stream runs what is enqueued on it in order, asynchronously to the host thread that
//   enqueued it. Enqueuing never waits for earlier work.
// - An Event marks a point in a stream: it is done once everything enqueued on that stream before
//   Record has completed.
// - Stream::Wait(event) orders the stream after the event without blocking the host: work
//   enqueued afterwards starts only once the event is done. This is how the compute stream
//   consumes pages a copy stream brings in, and how a copy stream avoids overwriting a slot the
//   compute stream may still be reading.
// Only Event::Synchronize and Stream::Synchronize block the host; they are the host
// synchronizations a backend counts (see Backend::counters()).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace specula {

class Event {
 public:
  virtual ~Event() = default;
  // Whether the marked work has completed. Never blocks.
  virtual bool Done() const = 0;
  // Blocks the calling thread until Done().
  virtual void Synchronize() = 0;
  // For two events from RecordTimed (of one stream, or of two streams of one backend): the
  // seconds from `earlier` to this one on the device's clock (how long a stream took between
  // them, a wait included); nullopt while either is not done. Never blocks. An event from
  // Record is refused (a CHECK): a GPU's are made without timing.
  virtual std::optional<double> SecondsSince(const Event& earlier) const = 0;
};

// One page of a batched gather: `page_bytes` bytes from src to dst. Either side may be pinned
// host memory or backend memory.
struct PageCopy {
  void* dst = nullptr;
  const void* src = nullptr;
};

class Stream {
 public:
  virtual ~Stream() = default;
  // Enqueues one batched copy of equal-sized pages (a gather or a scatter). The destinations of
  // one batch must not overlap: its copies may run in any order (CUDA's batched copy gives no
  // order within a batch). The list itself is captured at the call: it need not outlive it.
  virtual void CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) = 0;
  // An event marking everything enqueued so far.
  virtual std::shared_ptr<Event> Record() = 0;
  // Record, for an event that also keeps when the stream reached it (Event::SecondsSince): on a
  // GPU a timing event, costlier than Record's, so only where a duration is wanted.
  virtual std::shared_ptr<Event> RecordTimed() = 0;
  // Work enqueued after this call starts only once `event` (of any stream) is done.
  virtual void Wait(const std::shared_ptr<Event>& event) = 0;
  // Blocks the calling thread until everything enqueued so far has completed.
  virtual void Synchronize() = 0;
  // The first failure of work this stream has run since the last call; the call clears it.
  // Only the CPU copy stream has one (an injected fault, engine/common/fault_injection.h): on a
  // GPU a failed copy is a CUDA error, which is fatal to the process (docs/CUDA.md).
  virtual absl::Status TakeError() { return absl::OkStatus(); }
};

}  // namespace specula
