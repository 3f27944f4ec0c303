// The CUDA backend a GPU test runs on, or why there is none (no GPU visible: the test skips).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/backend_factory.h"

namespace specula::testing {

inline absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend() {
  BackendOptions options;
  options.device = DeviceKind::kCuda;
  return CreateBackend(options);
}

}  // namespace specula::testing
