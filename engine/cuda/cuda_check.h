// Checks of CUDA runtime and cuBLAS results inside the CUDA backend. A failed launch or copy in
// the forward pass usually leaves the CUDA context unusable (a sticky error), so it is fatal: the
// process prints the call and the error and aborts, and the orchestrator restarts it. Failures a
// caller can handle (an allocation) return a Status instead.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "engine/common/check.h"

#define CUDA_CHECK(expr)                                                  \
  do {                                                                    \
    const cudaError_t specula_cuda_error_ = (expr);                       \
    CHECK(specula_cuda_error_ == cudaSuccess)                             \
        << #expr << ": " << cudaGetErrorName(specula_cuda_error_) << " (" \
        << cudaGetErrorString(specula_cuda_error_) << ")";                \
  } while (0)

#define CUBLAS_CHECK(expr)                                                      \
  do {                                                                          \
    const cublasStatus_t specula_cublas_status_ = (expr);                       \
    CHECK(specula_cublas_status_ == CUBLAS_STATUS_SUCCESS)                      \
        << #expr << ": " << cublasGetStatusName(specula_cublas_status_) << " (" \
        << cublasGetStatusString(specula_cublas_status_) << ")";                \
  } while (0)
