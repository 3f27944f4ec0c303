// Picks the Backend for a device name, so nothing above the engine constructs a backend itself
// (the Generator asks for one by `model.device`).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace specula {

struct BackendOptions {
  std::string device = "auto";  // cpu | cuda | auto (the `model.device` key)
  int threads = 0;              // CPU threads, 0 = all cores
};

// "cpu": the CPU backend. "cuda": the CUDA backend on the first visible GPU; FAILED_PRECONDITION
// when this build has none or no GPU is usable (a silent CPU run would hide the
// misconfiguration). "auto": the CPU for now: the CUDA backend compiles in CI but has not yet
// passed its check on a GPU (tools/gpu/check.sh, issue 16), and auto will pick it once it has.
// Anything else: INVALID_ARGUMENT. Messages start with "model.device: ".
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// Whether this build has the CUDA backend (SPECULA_CUDA was on).
bool CudaBackendBuilt();

}  // namespace specula
