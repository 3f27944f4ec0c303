// The CUDA backend's entry points. The header names no CUDA type, so the backend factory can
// include it; the implementation (cuda_backend.cc) is built only when SPECULA_CUDA is on.
//
// Formats: weight matrices bf16 on the device (converted at upload; vectors such as norms and
// biases stay fp32), activations fp32, GEMMs with fp32 accumulation (one row: fp32 x on the
// skinny kernel; 2-16 rows: bf16 x on the few-row kernel; more: cuBLAS with bf16 inputs), KV pages
// in the view's dtype (bf16 by default). Semantics are the CPU backend's;
// tests/cuda/ compares them operation by operation.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace specula {

// A backend on the first visible CUDA device (CUDA_VISIBLE_DEVICES picks which GPU that is):
// every thread that touches the backend then uses device 0, the CUDA runtime's default, with no
// per-thread cudaSetDevice to forget. FAILED_PRECONDITION when no device is usable.
// `dependent_launches` (model.dependent_launches) sets the process's kernel launch policy
// (kernels/launch_policy.h).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(bool dependent_launches = true);

// OK when the CUDA runtime sees at least one device; FAILED_PRECONDITION saying why not (no
// driver, none visible, ...) otherwise. Creates no context.
absl::Status CudaDeviceVisible();

}  // namespace specula
