#include "engine/backend/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/cpu/cpu_backend.h"
#ifdef SPECULA_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace specula {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> Cuda([[maybe_unused]] const BackendOptions& options) {
#ifdef SPECULA_HAVE_CUDA
  return CreateCudaBackend(options.dependent_launches);
#else
  return absl::FailedPreconditionError(
      "model.device: cuda: this build has no CUDA backend (nvcc was not found when it was "
      "configured, or SPECULA_CUDA=OFF); use cpu or auto");
#endif
}

void LogChoice(const BackendOptions& options, absl::string_view device, absl::string_view reason) {
  Log(LogLevel::kInfo, "backend_selected",
      {{"device", device}, {"requested", DeviceKindName(options.device)}, {"reason", reason}});
}

}  // namespace

absl::Status CudaUsableForAuto() {
#ifdef SPECULA_HAVE_CUDA
  return CudaDeviceVisible();
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  switch (options.device) {
    case DeviceKind::kCpu:
      LogChoice(options, "cpu", "model.device is cpu");
      return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.threads));
    case DeviceKind::kCuda:
      LogChoice(options, "cuda", "model.device is cuda");
      return Cuda(options);
    case DeviceKind::kAuto:
      break;
  }
  // A visible GPU is used, and its failures (too little memory for the model, ...) are
  // errors: never a silent fall-back to a CPU run a hundred times slower.
  const absl::Status gpu = CudaUsableForAuto();
  if (gpu.ok()) {
    LogChoice(options, "cuda", "a CUDA device is visible and this build has the CUDA backend");
    return Cuda(options);
  }
  LogChoice(options, "cpu", gpu.message());
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.threads));
}

bool CudaBackendBuilt() {
#ifdef SPECULA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace specula
