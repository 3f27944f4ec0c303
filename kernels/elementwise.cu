#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/elementwise.h"

namespace specula::kernels {
namespace {

constexpr int kThreads = 256;

// Every kernel here is a dependent launch (dependent_launch.cuh) that starts with
// AfterPriorGrids: a decode step is a chain of small kernels, and each one's launch overlaps the
// one ahead of it.

template <typename T>
__global__ void EmbedKernel(EmbedParams p) {
  AfterPriorGrids();
  const T* table = static_cast<const T*>(p.table);
  ForEachCell(p.out.rows, p.out.cols, [&](int64_t r, int64_t c) {
    const int64_t id = p.ids[r];
    p.out.data[r * p.out.stride + c] = ToFloat(table[id * p.out.cols + c]);
  });
}

// Rows of up to kRmsNormRegisterCols elements are held in registers: each thread issues all its
// loads before it uses any, so a decode row (one block, on one SM) costs one memory round trip
// for x and one for the weight instead of one per element a thread handles (9 us against about
// 3 us for a 2048-wide row on an H100). Longer rows take the loop.
constexpr int kRmsNormPerThread = 16;
constexpr int64_t kRmsNormRegisterCols = int64_t{kRmsNormPerThread} * kThreads;

// The sum of squares of one vector in double (as the CPU backend), reduced over the block.
__device__ float InverseRms(double sum, int64_t cols, float eps, double* partial) {
  return static_cast<float>(1.0 / sqrt(BlockSum<kThreads>(sum, partial) / cols + eps));
}

// One block per vector (a row, or one head of a row). With a residual, the sum x + residual is
// written back to x before the norm reads it; each thread reads and writes the same columns, so
// y may alias x or the residual. A decode step's norm is one block: the GEMM after it may start
// loading its weights as soon as the norm has started.
__global__ void __launch_bounds__(kThreads) RmsNormKernel(RmsNormParams p) {
  AfterPriorGrids();
  __shared__ double partial[kThreads / 32];
  const int64_t cols = p.x.cols;
  const int64_t vectors = p.x.rows * p.heads;
  for (int64_t lr = blockIdx.x; lr < vectors; lr += gridDim.x) {
    const int64_t r = lr / p.heads, h = lr % p.heads;
    float* in = p.x.data + r * p.x.stride + h * cols;
    float* out = p.y.data + r * p.y.stride + h * cols;
    const float* res =
        p.residual.data == nullptr ? nullptr : p.residual.data + r * p.residual.stride;
    if (cols <= kRmsNormRegisterCols) {
      // Every load (x, the residual, the weight) is issued before the first store: x may alias
      // the residual, so a load after a store to x would wait for it, one round trip each.
      float v[kRmsNormPerThread], r[kRmsNormPerThread], w[kRmsNormPerThread];
#pragma unroll
      for (int i = 0; i < kRmsNormPerThread; ++i) {
        const int64_t c = threadIdx.x + int64_t{i} * kThreads;
        v[i] = c < cols ? in[c] : 0.0f;
        r[i] = res != nullptr && c < cols ? res[c] : 0.0f;
        w[i] = c < cols ? p.weight[c] : 0.0f;
      }
      double sum = 0.0;
#pragma unroll
      for (int i = 0; i < kRmsNormPerThread; ++i) {
        const int64_t c = threadIdx.x + int64_t{i} * kThreads;
        if (res != nullptr) {
          v[i] += r[i];
          if (c < cols) in[c] = v[i];
        }
        sum += static_cast<double>(v[i]) * v[i];
      }
      const float inv = InverseRms(sum, cols, p.eps, partial);
#pragma unroll
      for (int i = 0; i < kRmsNormPerThread; ++i) {
        const int64_t c = threadIdx.x + int64_t{i} * kThreads;
        if (c < cols) out[c] = v[i] * inv * w[i];
      }
      continue;
    }
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float v = res == nullptr ? in[c] : (in[c] = in[c] + res[c]);
      sum += static_cast<double>(v) * v;
    }
    const float inv = InverseRms(sum, cols, p.eps, partial);
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) out[c] = in[c] * inv * p.weight[c];
  }
}

__global__ void RopeKernel(RopeParams p) {
  AfterPriorGrids();
  const int32_t half = p.head_dim / 2;
  ForEachCell(p.x.rows, static_cast<int64_t>(p.num_heads) * half, [&](int64_t t, int64_t hi) {
    const int64_t h = hi / half;
    const int32_t i = static_cast<int32_t>(hi % half);
    double s, co;
    sincos(static_cast<double>(p.positions[t]) * p.inv_freq[i], &s, &co);
    const float cos_t = static_cast<float>(co), sin_t = static_cast<float>(s);
    float* v = p.x.data + t * p.x.stride + h * p.head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * cos_t - b * sin_t;
    v[i + half] = b * cos_t + a * sin_t;
  });
}

__global__ void SwiGluKernel(SwiGluParams p) {
  AfterPriorGrids();
  const int64_t n = p.out.cols;
  ForEachCell(p.out.rows, n, [&](int64_t r, int64_t c) {
    const float g = p.gate_up.data[r * p.gate_up.stride + c];
    const float u = p.gate_up.data[r * p.gate_up.stride + n + c];
    p.out.data[r * p.out.stride + c] = g / (1.0f + expf(-g)) * u;
  });
}

__global__ void AddKernel(AddParams p) {
  AfterPriorGrids();
  ForEachCell(p.x.rows, p.x.cols, [&](int64_t r, int64_t c) {
    p.x.data[r * p.x.stride + c] += p.y.data[r * p.y.stride + c];
  });
}

__global__ void AddBiasKernel(AddBiasParams p) {
  AfterPriorGrids();
  ForEachCell(p.y.rows, p.y.cols,
              [&](int64_t r, int64_t c) { p.y.data[r * p.y.stride + c] += p.bias[c]; });
}

__global__ void GatherRowsKernel(GatherRowsParams p) {
  AfterPriorGrids();
  ForEachCell(p.out.rows, p.out.cols, [&](int64_t r, int64_t c) {
    p.out.data[r * p.out.stride + c] = p.src.data[p.rows[r] * p.src.stride + c];
  });
}

__global__ void ToBf16Kernel(ToBf16Params p) {
  AfterPriorGrids();
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  ForEachCell(p.x.rows, p.x.cols, [&](int64_t r, int64_t c) {
    out[r * p.x.cols + c] = __float2bfloat16_rn(p.x.data[r * p.x.stride + c]);
  });
}

// Launches a ForEachCell kernel over rows x cols cells; nothing for an empty problem.
template <auto kKernel, typename Params>
cudaError_t LaunchOverCells(const Params& p, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return LaunchDependent<kKernel>(dim3(GridFor(rows * cols, kThreads)), dim3(kThreads), 0, stream,
                                  p);
}

}  // namespace

cudaError_t Embed(const EmbedParams& p, cudaStream_t stream) {
  return VisitStorageType(p.table_dtype, [&](auto tag) {
    return LaunchOverCells<EmbedKernel<decltype(tag)>>(p, p.out.rows, p.out.cols, stream);
  });
}

cudaError_t RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  // One residual row serves one vector: a residual with several heads a row is not a form.
  if (p.heads < 1 || (p.residual.data != nullptr && p.heads != 1)) return cudaErrorInvalidValue;
  const int64_t vectors = p.x.rows * p.heads;
  if (vectors == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(vectors < 65535 ? vectors : 65535);
  return LaunchDependent<RmsNormKernel>(dim3(blocks), dim3(kThreads), 0, stream, p);
}

cudaError_t Rope(const RopeParams& p, cudaStream_t stream) {
  return LaunchOverCells<RopeKernel>(p, p.x.rows,
                                     static_cast<int64_t>(p.num_heads) * (p.head_dim / 2), stream);
}

cudaError_t SwiGlu(const SwiGluParams& p, cudaStream_t stream) {
  return LaunchOverCells<SwiGluKernel>(p, p.out.rows, p.out.cols, stream);
}

cudaError_t Add(const AddParams& p, cudaStream_t stream) {
  return LaunchOverCells<AddKernel>(p, p.x.rows, p.x.cols, stream);
}

cudaError_t AddBias(const AddBiasParams& p, cudaStream_t stream) {
  return LaunchOverCells<AddBiasKernel>(p, p.y.rows, p.y.cols, stream);
}

cudaError_t GatherRows(const GatherRowsParams& p, cudaStream_t stream) {
  return LaunchOverCells<GatherRowsKernel>(p, p.out.rows, p.out.cols, stream);
}

cudaError_t ToBf16(const ToBf16Params& p, cudaStream_t stream) {
  return LaunchOverCells<ToBf16Kernel>(p, p.x.rows, p.x.cols, stream);
}

}  // namespace specula::kernels
