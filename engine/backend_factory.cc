#include "engine/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#ifdef SPECULA_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace specula {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.device == "cpu" || options.device == "auto") {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.threads));
  }
  if (options.device == "cuda") {
#ifdef SPECULA_HAVE_CUDA
    return CreateCudaBackend();
#else
    return absl::FailedPreconditionError(
        "model.device: cuda: this build has no CUDA backend (nvcc was not found when it was "
        "configured, or SPECULA_CUDA=OFF); use cpu or auto");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.device: unknown device '", options.device, "' (cpu, cuda or auto)"));
}

bool CudaBackendBuilt() {
#ifdef SPECULA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace specula
