#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/kv_write.h"

namespace specula::kernels {
namespace {

constexpr int kThreads = 256;

// A dependent launch (dependent_launch.cuh), as the other kernels of a decode step.
template <typename T>
__global__ void WriteKvKernel(KvWriteParams p) {
  AfterPriorGrids();
  const int64_t width = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t page_elems = 2 * static_cast<int64_t>(p.page_size) * p.head_dim;
  T* base = static_cast<T*>(p.base);
  // One cell per (token, head * head_dim + channel).
  ForEachCell(p.k.rows, width, [&](int64_t t, int64_t hc) {
    const int64_t h = hc / p.head_dim;
    const int64_t c = hc % p.head_dim;
    T* page = base + (static_cast<int64_t>(p.blocks[t]) * p.num_kv_heads + h) * page_elems;
    page[static_cast<int64_t>(p.offsets[t]) * p.head_dim + c] =
        FromFloat<T>(p.k.data[t * p.k.stride + hc]);
    page[(static_cast<int64_t>(p.page_size) + p.offsets[t]) * p.head_dim + c] =
        FromFloat<T>(p.v.data[t * p.v.stride + hc]);
  });
}

}  // namespace

cudaError_t WriteKv(const KvWriteParams& p, cudaStream_t stream) {
  if (p.k.rows == 0) return cudaSuccess;
  return VisitStorageType(p.dtype, [&](auto tag) {
    return LaunchDependent<WriteKvKernel<decltype(tag)>>(
        dim3(GridFor(p.k.rows * p.num_kv_heads * p.head_dim, kThreads)), dim3(kThreads), 0, stream,
        p);
  });
}

}  // namespace specula::kernels
