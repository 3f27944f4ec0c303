// Uploads the small host spans that backend operations take (token ids, positions, block tables,
// page lists) on a stream without a host synchronization. The bytes are copied into a pinned
// host ring at the call, so the caller may reuse its span at once, and an asynchronous copy to a
// device ring of the same size is enqueued on the stream; kernels enqueued afterwards read the
// device copy.
//
// The ring is cut into chunks. When an upload does not fit the rest of the current chunk, an
// event is recorded on the stream (everything that read the chunk precedes it) and the next chunk
// is used; a chunk is reused only after its event completed, which blocks the host only if the
// GPU is a whole ring behind. An upload larger than a chunk grows the ring (after a stream
// synchronization; it happens once per size class).
//
// Not thread-safe: one stream (the compute stream) and one thread use it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace specula {

class StagingRing {
 public:
  StagingRing(cudaStream_t stream, size_t chunk_bytes, int chunks);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // The device address of a copy of `bytes` bytes from `src`, valid for work enqueued on the
  // stream after this call and before `chunks` chunks' worth of later uploads.
  const void* Upload(const void* src, size_t bytes);
  template <typename T>
  const T* Upload(absl::Span<const T> span) {
    return static_cast<const T*>(Upload(span.data(), span.size() * sizeof(T)));
  }

 private:
  void Allocate(size_t chunk_bytes);
  void NextChunk();

  cudaStream_t stream_;
  int chunks_;
  size_t chunk_bytes_ = 0;
  char* host_ = nullptr;    // pinned, chunks_ * chunk_bytes_
  char* device_ = nullptr;  // same size
  int current_ = 0;
  size_t offset_ = 0;                  // within the current chunk
  std::vector<cudaEvent_t> released_;  // per chunk: recorded when the ring moved past it
  std::vector<bool> in_use_;           // per chunk: released_ was recorded and not yet waited
  // Device rings replaced by a growth: uploads made earlier in the same operation still point
  // into the last one, so each is freed only at the next growth or at destruction.
  std::vector<char*> retired_;
};

}  // namespace specula
