#include "engine/cuda/cuda_weight_uploader.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_check.h"

namespace specula::cuda_internal {
namespace {

// Below this a chunk is filled on the calling thread: starting the pool costs more.
constexpr int64_t kParallelFillBytes = int64_t{4} << 20;
// Each fill thread converts ranges of at least this many elements.
constexpr int64_t kFillGrain = int64_t{1} << 18;
// Reading the page cache scales to a few threads; more only contend.
constexpr unsigned kMaxFillThreads = 8;

}  // namespace

CudaWeightUploader::CudaWeightUploader(Allocator allocate, cudaStream_t stream,
                                       size_t staging_bytes)
    : allocate_(std::move(allocate)),
      stream_(stream),
      slot_budget_(std::max<size_t>(staging_bytes / 2, 1)) {}

CudaWeightUploader::~CudaWeightUploader() { WaitAndFreeStaging(); }

void CudaWeightUploader::WaitAndFreeStaging() {
  for (Slot& s : slots_) {
    // Unchecked: a destructor may run while the context is being torn down.
    if (s.copied != nullptr) {
      if (s.in_flight) cudaEventSynchronize(s.copied);
      cudaEventDestroy(s.copied);
    }
    if (s.host != nullptr) cudaFreeHost(s.host);
    s = Slot{};
  }
  slot_bytes_ = 0;
}

absl::Status CudaWeightUploader::EnsureStaging(size_t bytes) {
  bytes = std::min(bytes, slot_budget_);
  if (bytes <= slot_bytes_) return absl::OkStatus();
  WaitAndFreeStaging();
  for (Slot& s : slots_) {
    const cudaError_t e = cudaHostAlloc(&s.host, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky
      s.host = nullptr;
      WaitAndFreeStaging();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cuda backend: cannot pin %d bytes of host memory to stage weights: %s", bytes,
          cudaGetErrorString(e)));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
  slot_bytes_ = bytes;
  return absl::OkStatus();
}

void CudaWeightUploader::Fill(absl::Span<const WeightPart> parts, int64_t begin, int64_t n,
                              DType dtype, void* dst) {
  const size_t elem = DTypeSize(dtype);
  if (static_cast<int64_t>(n * elem) < kParallelFillBytes) {
    ConvertWeightRange(parts, begin, begin + n, dtype, dst);
    return;
  }
  if (fill_threads_ == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    fill_threads_ = std::make_unique<ThreadPool>(static_cast<int>(std::min(cores, kMaxFillThreads)));
  }
  fill_threads_->ParallelFor(n, kFillGrain, [&](int64_t b, int64_t e) {
    ConvertWeightRange(parts, begin + b, begin + e, dtype, static_cast<std::byte*>(dst) + b * elem);
  });
}

absl::StatusOr<Weight> CudaWeightUploader::Upload(absl::Span<const WeightPart> parts, int64_t out,
                                                  int64_t in) {
  const int64_t n = out * in;
  CHECK_EQ(TotalElements(parts), n);
  Weight w;
  w.out = out;
  w.in = in;
  // Vectors (norm weights, biases) stay fp32: they are tiny, and the kernels that read them
  // compute in fp32. Matrices are bf16, the format of the checkpoints and of cuBLAS's fast path.
  w.dtype = out == 1 ? DType::kF32 : DType::kBF16;
  const size_t elem = DTypeSize(w.dtype);
  ASSIGN_OR_RETURN(w.buffer, allocate_(static_cast<size_t>(n) * elem));
  RETURN_IF_ERROR(EnsureStaging(static_cast<size_t>(n) * elem));
  const int64_t chunk = static_cast<int64_t>(slot_bytes_ / elem);
  auto* device = static_cast<std::byte*>(w.buffer.data());
  for (int64_t begin = 0; begin < n; begin += chunk) {
    Slot& slot = slots_[next_slot_];
    next_slot_ ^= 1;
    // The slot's previous copy must have read it; the other slot's copy runs meanwhile.
    if (slot.in_flight) CUDA_CHECK(cudaEventSynchronize(slot.copied));
    const int64_t count = std::min(chunk, n - begin);
    Fill(parts, begin, count, w.dtype, slot.host);
    CUDA_CHECK(cudaMemcpyAsync(device + begin * elem, slot.host, count * elem,
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
    slot.in_flight = true;
  }
  return w;
}

}  // namespace specula::cuda_internal
