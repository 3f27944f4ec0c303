#include "engine/cuda/cuda_stream.h"

#include "engine/cuda/cuda_check.h"

namespace specula {

CudaEvent::CudaEvent(std::atomic<int64_t>* syncs, bool timing) : syncs_(syncs), timing_(timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

std::optional<double> CudaEvent::SecondsSince(const Event& earlier) const {
  const auto* e = dynamic_cast<const CudaEvent*>(&earlier);
  CHECK(e != nullptr && e->timing_ && timing_) << "SecondsSince needs two timing CUDA events";
  float ms = 0;
  const cudaError_t status = cudaEventElapsedTime(&ms, e->event_, event_);
  if (status == cudaErrorNotReady) return std::nullopt;
  CUDA_CHECK(status);
  return ms / 1e3;
}

void CudaEvent::RecordOn(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }

CudaEvent::~CudaEvent() { cudaEventDestroy(event_); }

bool CudaEvent::Done() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

void CudaEvent::Synchronize() {
  if (syncs_ != nullptr) ++*syncs_;
  CUDA_CHECK(cudaEventSynchronize(event_));
}

CudaStream::CudaStream(std::atomic<int64_t>* syncs) : syncs_(syncs) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void CudaStream::CopyPages(absl::Span<const PageCopy> copies, size_t page_bytes) {
  if (copies.empty()) return;
  dsts_.clear();
  srcs_.clear();
  for (const PageCopy& c : copies) {
    dsts_.push_back(c.dst);
    srcs_.push_back(c.src);
  }
  sizes_.assign(copies.size(), page_bytes);
  // One attribute set for the whole batch: sources are read in stream order (a page written by
  // earlier work on this stream, or by work this stream waited for, is copied as written).
  cudaMemcpyAttributes attrs = {};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attrs_index = 0;
  CUDA_CHECK(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), copies.size(), &attrs,
                                  &attrs_index, 1, stream_));
}

std::shared_ptr<Event> CudaStream::Record() {
  // A reused event may still be waited on by a stream: cudaStreamWaitEvent took its state at the
  // call, so recording it again does not move that wait.
  std::shared_ptr<CudaEvent> event =
      events_.Next([this] { return std::make_shared<CudaEvent>(syncs_); });
  event->RecordOn(stream_);
  return event;
}

std::shared_ptr<Event> CudaStream::RecordTimed() {
  std::shared_ptr<CudaEvent> event =
      timed_events_.Next([this] { return std::make_shared<CudaEvent>(syncs_, /*timing=*/true); });
  event->RecordOn(stream_);
  return event;
}

void CudaStream::Wait(const std::shared_ptr<Event>& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(event.get());
  CHECK(cuda_event != nullptr) << "a CUDA stream can only wait on a CUDA event";
  CUDA_CHECK(cudaStreamWaitEvent(stream_, cuda_event->raw(), 0));
}

void CudaStream::Synchronize() {
  if (syncs_ != nullptr) ++*syncs_;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace specula
