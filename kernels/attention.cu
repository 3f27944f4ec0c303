#include <algorithm>
#include <cstdint>

#include "engine/common/ceil_div.h"
#include "kernels/attention.h"
#include "kernels/attention_lists.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/attention_vector.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"

namespace specula::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;  // query heads per block; larger GQA groups take more blocks

// Running softmax state of one warp for up to kMaxGroup query heads; lane l holds channels
// [l * kPerLane, (l + 1) * kPerLane).
template <int kPerLane>
struct WarpState {
  float q[kMaxGroup][kPerLane];
  float m[kMaxGroup];
  float l[kMaxGroup];
  float acc[kMaxGroup][kPerLane];
};

template <typename T, int kPerLane>
__device__ __forceinline__ void AttendPage(const T* page, int32_t tokens, int32_t page_size,
                                           int32_t head_dim, int32_t heads, float scale,
                                           WarpState<kPerLane>& s) {
  const int lane = threadIdx.x % 32;
  for (int32_t t = 0; t < tokens; ++t) {
    float k[kPerLane], v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane * kPerLane + i;
      k[i] = c < head_dim ? ToFloat(page[static_cast<int64_t>(t) * head_dim + c]) : 0.0f;
      v[i] =
          c < head_dim ? ToFloat(page[static_cast<int64_t>(page_size + t) * head_dim + c]) : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= heads) break;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) dot += s.q[g][i] * k[i];
      const float score = WarpSum(dot) * scale;
      const float m_new = fmaxf(s.m[g], score);
      const float correction = expf(s.m[g] - m_new);
      const float weight = expf(score - m_new);
      s.l[g] = s.l[g] * correction + weight;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) s.acc[g][i] = s.acc[g][i] * correction + weight * v[i];
      s.m[g] = m_new;
    }
  }
}

// grid (rows * num_kv_heads, splits, head chunks), kWarps * 32 threads.
// Like every kernel of this file, a dependent launch (dependent_launch.cuh).
template <typename Lists, typename T, int kPerLane>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(AttentionCommon p, Lists lists, int32_t splits) {
  AfterPriorGrids();
  constexpr int kMaxDim = 32 * kPerLane;
  __shared__ WarpPartials<kWarps, kMaxGroup, kMaxDim> partials;

  const auto [row, kv_head, head0, heads, e_begin, e_end] =
      BlockPartOf(p, lists, splits, kMaxGroup);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  WarpState<kPerLane> s;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    s.m[g] = -INFINITY;
    s.l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane * kPerLane + i;
      s.acc[g][i] = 0.0f;
      s.q[g][i] = g < heads && c < p.head_dim
                      ? p.q[row * p.q_stride + static_cast<int64_t>(head0 + g) * p.head_dim + c]
                      : 0.0f;
    }
  }
  for (int32_t e = e_begin + warp; e < e_end; e += kWarps) {
    int32_t tokens;
    const auto* page = reinterpret_cast<const T*>(lists.entry(row, kv_head, e, &tokens));
    AttendPage<T, kPerLane>(page, tokens, p.page_size, p.head_dim, heads, p.scale, s);
  }

#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= heads) break;
    if (lane == 0) {
      partials.m[warp][g] = s.m[g];
      partials.l[warp][g] = s.l[g];
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) partials.acc[warp][g][lane * kPerLane + i] = s.acc[g][i];
  }
  __syncthreads();
  MergeWarpsAndWrite</*kLog2=*/false>(p, partials, row, head0, heads, splits);
}

// grid rows * num_heads, head_dim threads (rounded up to a warp). The output projection after it
// may start loading its weights as soon as it has started.
__global__ void CombineSplitsKernel(AttentionCommon p, int32_t splits) {
  AfterPriorGrids();
  const int64_t rh = blockIdx.x;  // row * num_heads + head
  const int c = threadIdx.x;
  if (c >= p.head_dim) return;
  const int64_t slots = static_cast<int64_t>(p.rows) * p.num_heads * splits;
  const float* ms = p.scratch + rh * splits;
  const float* ls = p.scratch + slots + rh * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, ms[s]);
  float l = 0.0f, a = 0.0f;
  for (int s = 0; s < splits; ++s) {
    if (ms[s] == -INFINITY) continue;
    const float f = expf(ms[s] - m);
    l += ls[s] * f;
    a += p.scratch[2 * slots + (rh * splits + s) * p.head_dim + c] * f;
  }
  const int64_t row = rh / p.num_heads, head = rh % p.num_heads;
  p.out[row * p.out_stride + head * p.head_dim + c] =
      l > 0.0f ? a / l : 0.0f;  // an empty list (the backend refuses one) gives 0, not NaN
}

// Splits per list: enough blocks to cover the GPU twice, at least two pages per split, within
// the workspace.
int32_t ChooseSplits(const AttentionCommon& p, int64_t base_blocks) {
  if (p.scratch == nullptr || p.max_pages < 4) return 1;
  const int64_t want = CeilDiv(2 * static_cast<int64_t>(p.sm_count), base_blocks);
  return SplitsWithinScratch(p.rows, p.num_heads, p.head_dim,
                             std::min<int64_t>(want, p.max_pages / 2), p.scratch_floats);
}

template <typename Lists, typename T>
cudaError_t LaunchRowKernel(const AttentionCommon& p, const Lists& lists, cudaStream_t stream) {
  const int32_t group = p.num_heads / p.num_kv_heads;
  const auto chunks = static_cast<unsigned>(CeilDiv(group, kMaxGroup));
  const int64_t base_blocks = static_cast<int64_t>(p.rows) * p.num_kv_heads * chunks;
  const int32_t splits = ChooseSplits(p, base_blocks);
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.rows) * p.num_kv_heads),
                  static_cast<unsigned>(splits), chunks);
  const int32_t hd = p.head_dim;
  const dim3 block(kWarps * 32);
  cudaError_t launched;
  if (hd <= 32) {
    launched =
        LaunchDependent<AttentionKernel<Lists, T, 1>>(grid, block, 0, stream, p, lists, splits);
  } else if (hd <= 64) {
    launched =
        LaunchDependent<AttentionKernel<Lists, T, 2>>(grid, block, 0, stream, p, lists, splits);
  } else if (hd <= 128) {
    launched =
        LaunchDependent<AttentionKernel<Lists, T, 4>>(grid, block, 0, stream, p, lists, splits);
  } else {
    launched =
        LaunchDependent<AttentionKernel<Lists, T, 8>>(grid, block, 0, stream, p, lists, splits);
  }
  if (launched != cudaSuccess || splits == 1) return launched;
  return CombineAttentionSplits(p, splits, stream);
}

// Splits for the vector kernel: the most that still fit one wave of `resident` blocks (a second,
// partial wave would leave SMs idle while it runs), each warp of a split with at least two pages,
// within the workspace.
int32_t ChooseVectorSplits(const AttentionCommon& p, int64_t base_blocks, int64_t resident) {
  constexpr int32_t kMinPagesPerSplit = 2 * vector_attention::kWarps;
  if (p.scratch == nullptr || p.max_pages < 2 * kMinPagesPerSplit) return 1;
  return SplitsWithinScratch(
      p.rows, p.num_heads, p.head_dim,
      std::min<int64_t>(resident / base_blocks, p.max_pages / kMinPagesPerSplit),
      p.scratch_floats);
}

// Query heads a vector-kernel block takes: the group rounded up to a power of two, at most 8.
int32_t VectorGroup(int32_t group) {
  int32_t g = 1;
  while (g < group && g < kMaxGroup) g *= 2;
  return g;
}

template <typename Lists, typename T, int L, int G>
cudaError_t LaunchVector(const AttentionCommon& p, const Lists& lists, cudaStream_t stream) {
  const int32_t group = p.num_heads / p.num_kv_heads;
  const auto chunks = static_cast<unsigned>(CeilDiv(group, G));
  constexpr auto kernel = vector_attention::VectorAttentionKernel<Lists, T, L, G>;
  constexpr int kThreads = vector_attention::kWarps * 32;
  static const int blocks_per_sm = [] {  // the registers decide; one answer per kernel
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0);
    return std::max(n, 1);
  }();
  const int32_t splits =
      ChooseVectorSplits(p, static_cast<int64_t>(p.rows) * p.num_kv_heads * chunks,
                         static_cast<int64_t>(blocks_per_sm) * p.sm_count);
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.rows) * p.num_kv_heads),
                  static_cast<unsigned>(splits), chunks);
  const cudaError_t launched =
      LaunchDependent<kernel>(grid, dim3(kThreads), 0, stream, p, lists, splits);
  if (launched != cudaSuccess || splits == 1) return launched;
  return CombineAttentionSplits(p, splits, stream);
}

template <typename Lists, typename T, int L>
cudaError_t LaunchVectorGroups(const AttentionCommon& p, const Lists& lists,
                               cudaStream_t stream) {
  switch (VectorGroup(p.num_heads / p.num_kv_heads)) {
    case 1:
      return LaunchVector<Lists, T, L, 1>(p, lists, stream);
    case 2:
      return LaunchVector<Lists, T, L, 2>(p, lists, stream);
    case 4:
      return LaunchVector<Lists, T, L, 4>(p, lists, stream);
    default:
      return LaunchVector<Lists, T, L, 8>(p, lists, stream);
  }
}

// The vector kernel when the shape suits it and the pages are 16-byte aligned (both bases are,
// and a page's bytes are a multiple of 16 when head_dim is a multiple of the vector), else the
// row kernel.
template <typename Lists, typename T>
cudaError_t LaunchTyped(const AttentionCommon& p, const Lists& lists, const void* host_base,
                        cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(p.kv_base) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(host_base) % 16 == 0;
  switch (aligned ? vector_attention::LanesPerToken<T>(p.head_dim) : 0) {
    case 8:
      return LaunchVectorGroups<Lists, T, 8>(p, lists, stream);
    case 16:
      return LaunchVectorGroups<Lists, T, 16>(p, lists, stream);
    case 32:
      return LaunchVectorGroups<Lists, T, 32>(p, lists, stream);
    default:
      return LaunchRowKernel<Lists, T>(p, lists, stream);
  }
}

bool Valid(const AttentionCommon& p) {
  return p.head_dim >= 2 && p.head_dim <= 256 && p.num_kv_heads >= 1 && p.num_heads >= 1 &&
         p.num_heads % p.num_kv_heads == 0 && p.page_size >= 1;
}

template <typename Lists>
cudaError_t Launch(const AttentionCommon& p, const Lists& lists, const void* host_base,
                   cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (!Valid(p)) return cudaErrorInvalidValue;
  return VisitStorageType(p.dtype, [&](auto tag) {
    return LaunchTyped<Lists, decltype(tag)>(p, lists, host_base, stream);
  });
}

}  // namespace

cudaError_t CombineAttentionSplits(const AttentionCommon& p, int32_t splits,
                                   cudaStream_t stream) {
  const int threads = (p.head_dim + 31) / 32 * 32;
  return LaunchDependent<CombineSplitsKernel>(
      dim3(static_cast<unsigned>(static_cast<int64_t>(p.rows) * p.num_heads)), dim3(threads), 0,
      stream, p, splits);
}

size_t AttentionScratchFloats(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t splits) {
  return static_cast<size_t>(rows) * num_heads * splits * (2 + static_cast<size_t>(head_dim));
}

int32_t SplitsWithinScratch(int32_t rows, int32_t num_heads, int32_t head_dim, int64_t splits,
                            size_t scratch_floats) {
  const size_t per_split = AttentionScratchFloats(rows, num_heads, head_dim, 1);
  const int64_t fit = per_split == 0 ? splits : static_cast<int64_t>(scratch_floats / per_split);
  return static_cast<int32_t>(std::max<int64_t>(1, std::min(splits, fit)));
}

int64_t PageBytes(const AttentionCommon& p) {
  return 2 * static_cast<int64_t>(p.page_size) * p.head_dim * DTypeSize(p.dtype);
}

cudaError_t PagedAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  const DenseLists lists{p.row_keys,
                         p.row_block_begin,
                         p.blocks,
                         static_cast<const char*>(p.common.kv_base),
                         PageBytes(p.common),
                         p.common.page_size,
                         p.common.num_kv_heads};
  return Launch(p.common, lists, /*host_base=*/nullptr, stream);
}

cudaError_t SparseDecodeAttention(const SparseAttentionParams& p, cudaStream_t stream) {
  const SparseLists lists{p.list_begin,
                          p.list_count,
                          p.pages,
                          p.page_tokens,
                          static_cast<const char*>(p.common.kv_base),
                          static_cast<const char*>(p.host_base),
                          PageBytes(p.common),
                          p.common.num_kv_heads};
  return Launch(p.common, lists, p.host_base, stream);
}

}  // namespace specula::kernels
