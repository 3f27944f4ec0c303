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

// "cpu": the CPU backend. "auto": the best backend this build and machine have (the CPU today).
// "cuda": FAILED_PRECONDITION until the CUDA backend exists (a silent CPU run would hide the
// misconfiguration). Anything else: INVALID_ARGUMENT. Messages start with "model.device: ".
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace specula
