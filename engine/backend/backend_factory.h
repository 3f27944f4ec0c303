// Picks the Backend for a device name, so nothing above the engine constructs a backend itself
// (the Generator asks for one by `model.device`).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/common/device_kind.h"

namespace specula {

struct BackendOptions {
  DeviceKind device = DeviceKind::kAuto;
  int threads = 0;  // CPU threads, 0 = all cores
  // model.dependent_launches: on a GPU, each kernel of a step launched while the one ahead of it
  // runs (programmatic dependent launch, sm_90); false launches each after the one ahead ends.
  bool dependent_launches = true;
};

// kCuda fails with FAILED_PRECONDITION when this build has no CUDA backend or no GPU is usable
// (a silent CPU run would hide the misconfiguration); kAuto's GPU failures (too little memory
// for the model, ...) are errors too, never a silent fall-back. Messages start with
// "model.device: ". Logs the choice and its reason (`backend_selected`).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// Whether `auto` picks CUDA: OK, or why not ("this build has no CUDA backend", "no usable CUDA
// device (...)").
absl::Status CudaUsableForAuto();

// Whether this build has the CUDA backend (SPECULA_CUDA was on).
bool CudaBackendBuilt();

}  // namespace specula
