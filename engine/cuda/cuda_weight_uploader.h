// Weight upload for the CUDA backend: checkpoint tensors are converted straight into bf16
// (matrices) or fp32 (vectors) in pinned staging buffers, filled by several threads, and copied to
// the device on the compute stream while the next buffer fills. No fp32 copy of the model is made,
// and the copy engine reads page-locked memory at full PCIe bandwidth. Internal to engine/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <functional>
#include <memory>

#include "engine/backend/backend.h"
#include "engine/common/thread_pool.h"

namespace specula::cuda_internal {

class CudaWeightUploader : public WeightUploader {
 public:
  using Allocator = std::function<absl::StatusOr<DeviceBuffer>(size_t)>;
  // `allocate` gives device memory; copies go on `stream`. Staging holds at most
  // `staging_bytes` in all, in two halves that alternate.
  CudaWeightUploader(Allocator allocate, cudaStream_t stream, size_t staging_bytes);
  ~CudaWeightUploader() override;

  absl::StatusOr<Weight> Upload(absl::Span<const WeightPart> parts, int64_t out,
                                int64_t in) override;

 private:
  struct Slot {
    void* host = nullptr;  // pinned, slot_bytes_
    cudaEvent_t copied = nullptr;
    bool in_flight = false;
  };
  // Pinned staging for chunks of `bytes` (at most half the budget), allocated on first use.
  absl::Status EnsureStaging(size_t bytes);
  // Converts elements [begin, begin + n) of the parts into `dst`, on the fill threads when large.
  void Fill(absl::Span<const WeightPart> parts, int64_t begin, int64_t n, DType dtype, void* dst);
  void WaitAndFreeStaging();

  Allocator allocate_;
  cudaStream_t stream_;
  size_t slot_budget_;
  size_t slot_bytes_ = 0;
  std::array<Slot, 2> slots_;
  int next_slot_ = 0;
  std::unique_ptr<ThreadPool> fill_threads_;  // created for the first large weight
};

}  // namespace specula::cuda_internal
