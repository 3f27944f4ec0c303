// The CUDA backend's streams and events (semantics in engine/backend/stream.h), thin owners of a
// cudaStream_t / cudaEvent_t. Streams are non-blocking (they never wait on the legacy default
// stream); batched page copies are one cudaMemcpyBatchAsync call on the copy engines.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/event_ring.h"
#include "engine/backend/stream.h"

namespace specula {

class CudaEvent : public Event {
 public:
  // Synchronize counts in `syncs` (the backend's host-sync counter; may be null). `timing`: a
  // timing event (RecordTimed), which SecondsSince can read; others are created without timing.
  explicit CudaEvent(std::atomic<int64_t>* syncs, bool timing = false);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool Done() const override;
  void Synchronize() override;
  // cudaEventElapsedTime; both must be timing events.
  std::optional<double> SecondsSince(const Event& earlier) const override;
  // Marks the current end of `stream` (again: events are reused, EventRing).
  void RecordOn(cudaStream_t stream);
  cudaEvent_t raw() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  std::atomic<int64_t>* syncs_;
  bool timing_;
};

class CudaStream : public Stream {
 public:
  // `syncs`, if set, counts the host synchronizations on this stream and its events (the
  // backend's counter).
  explicit CudaStream(std::atomic<int64_t>* syncs = nullptr);
  ~CudaStream() override;  // waits for what is enqueued, like the CPU copy stream
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) override;
  std::shared_ptr<Event> Record() override;
  std::shared_ptr<Event> RecordTimed() override;
  void Wait(const std::shared_ptr<Event>& event) override;
  void Synchronize() override;
  cudaStream_t raw() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  std::atomic<int64_t>* syncs_;
  EventRing<CudaEvent> events_;  // Record: no cudaEventCreate per layer and step
  EventRing<CudaEvent> timed_events_;  // RecordTimed's timing events
  // CopyPages' argument arrays, reused (a stream is used by one thread at a time).
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace specula
