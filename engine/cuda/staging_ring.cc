#include "engine/cuda/staging_ring.h"

#include <cstring>

#include "engine/cuda/cuda_check.h"

namespace specula {
namespace {
constexpr size_t kAlign = 256;  // what cudaMalloc guarantees: any element type is aligned
}

StagingRing::StagingRing(cudaStream_t stream, size_t chunk_bytes, int chunks)
    : stream_(stream), chunks_(chunks), released_(chunks), in_use_(chunks, false) {
  for (cudaEvent_t& e : released_) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  Allocate(chunk_bytes);
}

StagingRing::~StagingRing() {
  cudaStreamSynchronize(stream_);
  cudaFreeHost(host_);
  cudaFree(device_);
  for (char* d : retired_) cudaFree(d);
  for (cudaEvent_t e : released_) cudaEventDestroy(e);
}

void StagingRing::Allocate(size_t chunk_bytes) {
  chunk_bytes_ = (chunk_bytes + kAlign - 1) / kAlign * kAlign;
  const size_t total = chunk_bytes_ * chunks_;
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), total, cudaHostAllocPortable));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), total));
  current_ = 0;
  offset_ = 0;
  in_use_.assign(chunks_, false);
}

void StagingRing::NextChunk() {
  CUDA_CHECK(cudaEventRecord(released_[current_], stream_));
  in_use_[current_] = true;
  current_ = (current_ + 1) % chunks_;
  offset_ = 0;
  if (in_use_[current_]) {
    CUDA_CHECK(cudaEventSynchronize(released_[current_]));
    in_use_[current_] = false;
  }
}

const void* StagingRing::Upload(const void* src, size_t bytes) {
  if (bytes == 0) return device_;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded > chunk_bytes_) {
    // After this sync every enqueued copy and kernel is done: the pinned ring and older retired
    // rings are free. The current device ring is not: this operation's earlier uploads point
    // into it, read by a kernel not yet enqueued.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (char* d : retired_) cudaFree(d);
    retired_.assign(1, device_);
    CUDA_CHECK(cudaFreeHost(host_));
    Allocate(rounded * 2);
  } else if (offset_ + rounded > chunk_bytes_) {
    NextChunk();
  }
  const size_t at = static_cast<size_t>(current_) * chunk_bytes_ + offset_;
  std::memcpy(host_ + at, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(device_ + at, host_ + at, bytes, cudaMemcpyHostToDevice, stream_));
  offset_ += rounded;
  return device_ + at;
}

}  // namespace specula
