// The `model.device` key: which backend runs the model (engine/backend/backend_factory.h creates
// it).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specula {

// cpu: the CPU backend. cuda: the CUDA backend on the first visible GPU. auto: CUDA when this
// build has it and a GPU is visible, the CPU otherwise.
enum class DeviceKind { kCpu, kCuda, kAuto };

absl::string_view DeviceKindName(DeviceKind device);  // "cpu" | "cuda" | "auto"
// INVALID_ARGUMENT "must be one of cpu, cuda, auto, got 'NAME'" for anything else.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

}  // namespace specula
