#include <algorithm>

#include "engine/common/ceil_div.h"
#include "kernels/attention.h"
#include "kernels/device_math.cuh"

namespace specula::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;  // query heads per block; larger GQA groups take more blocks

// Where one (row, KV head) list's pages are, for the dense and the sparse layout: entry e's first
// byte and its valid tokens.
struct DenseLists {
  const int32_t* row_keys;
  const int32_t* row_block_begin;
  const int32_t* blocks;
  const char* kv_base;
  int64_t page_bytes;
  int32_t page_size;
  int32_t num_kv_heads;
  __device__ int32_t count(int32_t row, int32_t) const {
    return static_cast<int32_t>(CeilDiv(row_keys[row], page_size));
  }
  __device__ const char* entry(int32_t row, int32_t kv_head, int32_t e, int32_t* tokens) const {
    *tokens = min(page_size, row_keys[row] - e * page_size);
    return kv_base +
           (static_cast<int64_t>(blocks[row_block_begin[row] + e]) * num_kv_heads + kv_head) *
               page_bytes;
  }
};

// A negative page is HostPageRef(p): page p of the host store, read through its mapped address.
struct SparseLists {
  const int32_t* list_begin;
  const int32_t* list_count;
  const int32_t* pages;
  const int32_t* page_tokens;
  const char* kv_base;
  const char* host_base;
  int64_t page_bytes;
  int32_t num_kv_heads;
  __device__ int32_t count(int32_t row, int32_t kv_head) const {
    return list_count[row * num_kv_heads + kv_head];
  }
  __device__ const char* entry(int32_t row, int32_t kv_head, int32_t e, int32_t* tokens) const {
    const int32_t at = list_begin[row * num_kv_heads + kv_head] + e;
    *tokens = page_tokens[at];
    const int32_t ref = pages[at];
    return ref < 0 ? host_base + static_cast<int64_t>(-1 - ref) * page_bytes
                   : kv_base + static_cast<int64_t>(ref) * page_bytes;
  }
};

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
template <typename Lists, typename T, int kPerLane>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(AttentionCommon p, Lists lists, int32_t splits) {
  constexpr int kMaxDim = 32 * kPerLane;
  __shared__ float shared_m[kWarps][kMaxGroup];
  __shared__ float shared_l[kWarps][kMaxGroup];
  __shared__ float shared_acc[kWarps][kMaxGroup][kMaxDim];

  const int32_t row = blockIdx.x / p.num_kv_heads;
  const int32_t kv_head = blockIdx.x % p.num_kv_heads;
  const int32_t group = p.num_heads / p.num_kv_heads;
  const int32_t head0 = kv_head * group + blockIdx.z * kMaxGroup;
  const int32_t heads = min(kMaxGroup, group - static_cast<int32_t>(blockIdx.z) * kMaxGroup);
  const int32_t count = lists.count(row, kv_head);
  const auto per_split = static_cast<int32_t>(CeilDiv(count, splits));
  const int32_t e_begin = blockIdx.y * per_split;
  const int32_t e_end = min(count, e_begin + per_split);
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
      shared_m[warp][g] = s.m[g];
      shared_l[warp][g] = s.l[g];
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) shared_acc[warp][g][lane * kPerLane + i] = s.acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < heads * p.head_dim; idx += blockDim.x) {
    const int g = idx / p.head_dim, c = idx % p.head_dim;
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, shared_m[w][g]);
    float l = 0.0f, a = 0.0f;
    if (m != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        if (shared_m[w][g] == -INFINITY) continue;
        const float f = expf(shared_m[w][g] - m);
        l += shared_l[w][g] * f;
        a += shared_acc[w][g][c] * f;
      }
    }
    const int64_t head = head0 + g;
    if (splits == 1) {
      p.out[row * p.out_stride + head * p.head_dim + c] =
          l > 0.0f ? a / l : 0.0f;  // an empty list (the backend refuses one) gives 0, not NaN
    } else {
      const int64_t slot = (static_cast<int64_t>(row) * p.num_heads + head) * splits + blockIdx.y;
      const int64_t slots = static_cast<int64_t>(p.rows) * p.num_heads * splits;
      if (c == 0) {
        p.scratch[slot] = m;
        p.scratch[slots + slot] = l;
      }
      p.scratch[2 * slots + slot * p.head_dim + c] = a;
    }
  }
}

// grid rows * num_heads, head_dim threads (rounded up to a warp).
__global__ void CombineSplitsKernel(AttentionCommon p, int32_t splits) {
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
  int64_t splits = std::min<int64_t>(want, p.max_pages / 2);
  while (splits > 1 && AttentionScratchFloats(p.rows, p.num_heads, p.head_dim,
                                              static_cast<int32_t>(splits)) > p.scratch_floats) {
    --splits;
  }
  return static_cast<int32_t>(std::max<int64_t>(1, splits));
}

template <typename Lists, typename T>
cudaError_t LaunchTyped(const AttentionCommon& p, const Lists& lists, cudaStream_t stream) {
  const int32_t group = p.num_heads / p.num_kv_heads;
  const auto chunks = static_cast<unsigned>(CeilDiv(group, kMaxGroup));
  const int64_t base_blocks = static_cast<int64_t>(p.rows) * p.num_kv_heads * chunks;
  const int32_t splits = ChooseSplits(p, base_blocks);
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.rows) * p.num_kv_heads),
                  static_cast<unsigned>(splits), chunks);
  const int32_t hd = p.head_dim;
  if (hd <= 32) {
    AttentionKernel<Lists, T, 1><<<grid, kWarps * 32, 0, stream>>>(p, lists, splits);
  } else if (hd <= 64) {
    AttentionKernel<Lists, T, 2><<<grid, kWarps * 32, 0, stream>>>(p, lists, splits);
  } else if (hd <= 128) {
    AttentionKernel<Lists, T, 4><<<grid, kWarps * 32, 0, stream>>>(p, lists, splits);
  } else {
    AttentionKernel<Lists, T, 8><<<grid, kWarps * 32, 0, stream>>>(p, lists, splits);
  }
  if (splits > 1) return CombineAttentionSplits(p, splits, stream);
  return LaunchStatus();
}

bool Valid(const AttentionCommon& p) {
  return p.head_dim >= 2 && p.head_dim <= 256 && p.num_kv_heads >= 1 && p.num_heads >= 1 &&
         p.num_heads % p.num_kv_heads == 0 && p.page_size >= 1;
}

template <typename Lists>
cudaError_t Launch(const AttentionCommon& p, const Lists& lists, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (!Valid(p)) return cudaErrorInvalidValue;
  return VisitStorageType(
      p.dtype, [&](auto tag) { return LaunchTyped<Lists, decltype(tag)>(p, lists, stream); });
}

}  // namespace

cudaError_t CombineAttentionSplits(const AttentionCommon& p, int32_t splits,
                                   cudaStream_t stream) {
  const int threads = (p.head_dim + 31) / 32 * 32;
  CombineSplitsKernel<<<static_cast<unsigned>(static_cast<int64_t>(p.rows) * p.num_heads), threads,
                        0, stream>>>(p, splits);
  return LaunchStatus();
}

size_t AttentionScratchFloats(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t splits) {
  return static_cast<size_t>(rows) * num_heads * splits * (2 + static_cast<size_t>(head_dim));
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
  return Launch(p.common, lists, stream);
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
  return Launch(p.common, lists, stream);
}

}  // namespace specula::kernels
