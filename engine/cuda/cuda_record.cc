// The CUDA backend's recording of compute-stream operations as a CUDA graph (Backend::Record):
// stream capture, instantiated once, replayed with one cudaGraphLaunch. A replay launches the
// recorded kernels with their recorded arguments, so it refuses to run once backend memory they
// pointed into has been reallocated (the GEMM input buffer grew).
#include <cuda_runtime_api.h>

#include <memory>

#include "engine/common/log.h"
#include "engine/cuda/cuda_backend_impl.h"
#include "engine/cuda/cuda_check.h"

namespace specula::cuda_internal {
namespace {

class CudaRecordedOps : public RecordedOps {
 public:
  CudaRecordedOps(cudaGraphExec_t exec, cudaStream_t stream, const CudaBackend& backend)
      : exec_(exec),
        stream_(stream),
        backend_(backend),
        recorded_at_(backend.memory_generation()) {}
  ~CudaRecordedOps() override { cudaGraphExecDestroy(exec_); }
  CudaRecordedOps(const CudaRecordedOps&) = delete;
  CudaRecordedOps& operator=(const CudaRecordedOps&) = delete;

  bool Replay() override {
    if (backend_.memory_generation() != recorded_at_) return false;
    CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    return true;
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  const CudaBackend& backend_;
  uint64_t recorded_at_;
};

// A recording that failed leaves nothing enqueued and no sticky error: log it and go on eager.
std::unique_ptr<RecordedOps> NotRecorded(const char* what, cudaError_t e) {
  cudaGetLastError();
  LogAsync(LogLevel::kWarning, "cuda_graph_not_recorded",
           {{"stage", what}, {"error", cudaGetErrorName(e)}, {"message", cudaGetErrorString(e)}});
  return nullptr;
}

}  // namespace

std::unique_ptr<RecordedOps> CudaBackend::Record(absl::FunctionRef<void()> enqueue) {
  CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  enqueue();
  cudaGraph_t graph = nullptr;
  if (const cudaError_t e = cudaStreamEndCapture(stream(), &graph); e != cudaSuccess) {
    return NotRecorded("capture", e);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return NotRecorded("instantiate", e);
  return std::make_unique<CudaRecordedOps>(exec, stream(), *this);
}

}  // namespace specula::cuda_internal
