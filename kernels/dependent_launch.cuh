// Programmatic dependent launch (sm_90 and later): a kernel launched with LaunchDependent may
// start while the kernel ahead of it in the stream is still running, so that work which does not
// depend on that kernel (loading weights) overlaps its tail and the launch itself. Such a kernel
// must call WaitForPriorGrids before it reads anything the kernel ahead writes, and before it
// writes anything that kernel reads or writes. A kernel that calls AllowDependentLaunch lets its
// successor's blocks be scheduled before it finishes (by default that happens when its last
// block exits); the successor's WaitForPriorGrids still waits for it to complete and for its
// writes to be visible, so the hint cannot make a result wrong.
#pragma once

#include <cuda_runtime.h>

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

// kernel<<<grid, block, 0, stream>>>(args...), allowed to overlap the kernel ahead of it when it
// was compiled to wait for it (`dependent`, from CompiledWithGridDependencyControl, computed once
// per kernel by the caller).
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(bool dependent, void (*kernel)(Params...), dim3 grid, dim3 block,
                            cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace specula::kernels
