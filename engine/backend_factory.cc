#include "engine/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"

namespace specula {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.device == "cpu" || options.device == "auto") {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(options.threads));
  }
  if (options.device == "cuda") {
    return absl::FailedPreconditionError(
        "model.device: cuda: this build has no CUDA backend yet; use cpu or auto");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.device: unknown device '", options.device, "' (cpu, cuda or auto)"));
}

}  // namespace specula
