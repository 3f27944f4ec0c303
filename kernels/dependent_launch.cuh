// Programmatic dependent launch (sm_90 and later): a kernel launched with LaunchDependent may
// start while the kernel ahead of it in the stream is still running, so that its launch, and work
// which does not depend on that kernel (loading weights), overlap that kernel's tail. Such a
// kernel must call WaitForPriorGrids before it reads anything an earlier kernel writes, and
// before it writes anything an earlier kernel reads or writes (the wait covers every grid the
// launch depends on: in PTX's words, all prerequisite grids in flight). A kernel that calls
// AllowDependentLaunch lets its successor's blocks be scheduled before it finishes (by default
// that happens when its last block exits); the successor's WaitForPriorGrids still waits for it
// to complete and for its writes to be visible, so the hint cannot make a result wrong.
#pragma once

#include <cuda_runtime.h>

#include "kernels/device_math.cuh"
#include "kernels/launch_policy.h"

namespace specula::kernels {

// Returns once every grid this one depends on has completed and its memory is visible; at once
// when the kernel was launched without programmatic serialization.
__device__ __forceinline__ void WaitForPriorGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel in the stream, if launched with LaunchDependent, be scheduled now. Call it
// from every thread, before any early return.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The start of a kernel launched with LaunchDependent that touches nothing before it waits: wait
// for the kernel ahead, then let the next one be scheduled. Together they take the launch and
// the block scheduling of each kernel off the critical path, which is what a step of many small
// kernels (batch-1 decode: ~240) loses most between kernels. Call it from every thread, before
// any early return.
__device__ __forceinline__ void AfterPriorGrids() {
  WaitForPriorGrids();
  AllowDependentLaunch();
}

// Whether `kernel` was compiled with the waits above (PTX for sm_90 or later). A kernel whose
// PTX is older would not wait, so it is launched the ordinary way even on a Hopper GPU that
// runs it.
template <typename... Params>
bool CompiledWithGridDependencyControl(void (*kernel)(Params...)) {
  cudaFuncAttributes attributes;
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();  // not sticky; the launch itself reports a real failure
    return false;
  }
  return attributes.ptxVersion >= 90;
}

// kKernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap the kernel ahead of
// it in the stream when it was compiled to wait for it (decided once per kernel) and dependent
// launches are on (launch_policy.h). The launch's status, and the last error, read and cleared.
template <auto kKernel, typename... Args>
cudaError_t LaunchDependent(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                            Args... args) {
  static const bool dependent = CompiledWithGridDependencyControl(kKernel);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent && DependentLaunches() ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kKernel, args...);
  const cudaError_t last = LaunchStatus();
  return launched != cudaSuccess ? launched : last;
}

}  // namespace specula::kernels
