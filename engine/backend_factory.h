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
// misconfiguration). "auto": CUDA when this build has it and a GPU is visible (it passed its
// check on an H200, tools/gpu/check.sh), the CPU otherwise. Anything else: INVALID_ARGUMENT.
// Messages start with "model.device: ". Logs the choice and its reason (`backend_selected`).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// Whether `auto` picks CUDA: OK, or why not ("this build has no CUDA backend", "no usable CUDA
// device (...)").
absl::Status CudaUsableForAuto();

// Whether this build has the CUDA backend (SPECULA_CUDA was on).
bool CudaBackendBuilt();

}  // namespace specula
