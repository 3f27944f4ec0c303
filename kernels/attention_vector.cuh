// The decode attention kernel of attention.cu for head sizes whose K (or V) row fits in one
// 16-byte load per lane of a warp (head_dim * element size <= 512 bytes and a multiple of 16):
// bf16/f16 head_dim 64..256, fp32 64..128. Decode reads every KV byte once, so what matters is
// bytes in flight, not arithmetic. Design:
// - A warp reads several tokens at once: L = head_dim / (16 / sizeof(T)) lanes (rounded up to a
//   power of two) hold one token's row, 16 bytes each, so 32 / L tokens come per load; each lane
//   issues kLoads K loads and kLoads V loads before it uses any (4-8 KB per warp in flight), and
//   the loads of its next step before it computes the current one (software pipelining: at
//   batch 1 a warp has only ~10 steps a split, and without it half of each step's time had no
//   load in flight). The page table is read 32 entries at a time, one per lane, so a page's
//   address is not a dependent load in front of its K/V loads.
// - The GQA group's query heads (up to G per block) share each load; q is pre-scaled by
//   scale * log2(e) so the softmax runs on exp2.
// - Scores reduce over the L lanes of a token (log2(L) shuffles); the online softmax updates
//   once per step of 32 / L * kLoads tokens, with the running max shared by the warp, while each
//   lane keeps its own partial sum and accumulator for its tokens, merged across the warp's
//   token slots only once, at the end of its split.
// - Warps merge in shared memory (attention_merge.cuh); with splits > 1 the partials go to the
//   scratch of kernels/attention.h for CombineAttentionSplits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/attention_lists.cuh"
#include "kernels/attention_merge.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"

namespace specula::kernels::vector_attention {

constexpr int kWarps = 4;
constexpr float kLog2E = 1.4426950408889634f;

// Loads per lane per step: fewer with 8 query heads a block, whose q and accumulators take the
// registers that would hold them.
template <int G>
constexpr int kLoads = G >= 8 ? 2 : 4;

// The warp's running state for G query heads, over the channels [c0, c0 + kVec) of its lane.
template <typename T, int G>
struct LaneState {
  float q[G][kVec<T>];
  float acc[G][kVec<T>];
  float l[G];  // this lane's token slot's partial sum
  float m[G];  // warp-wide running max, log2 units
};

// The K and V loads of one step: each lane's kLoads 16-byte loads of each.
template <int G>
struct StepLoads {
  uint4 k[kLoads<G>];
  uint4 v[kLoads<G>];
};

// One step of a warp: tokens [t0, t0 + 32 / L * kLoads) of a page, those below `tokens`.
template <typename T>
struct Step {
  const T* page = nullptr;
  int32_t t0 = 0;
  int32_t tokens = 0;
  int32_t k = -1;  // the warp's entry (see WarpEntries)
  bool valid = true;
};

// Issues a step's loads; nothing is used until ComputeStep, so the loads of the next step are in
// flight while the current one computes.
template <typename T, int L, int G>
__device__ __forceinline__ void LoadStep(const Step<T>& step, int32_t page_size, int32_t head_dim,
                                         int slot, int c0, StepLoads<G>& r) {
  constexpr int kPerLoad = 32 / L;
#pragma unroll
  for (int i = 0; i < kLoads<G>; ++i) {
    const int32_t t = step.t0 + i * kPerLoad + slot;
    r.k[i] = r.v[i] = make_uint4(0, 0, 0, 0);
    if (t < step.tokens && c0 < head_dim) {
      r.k[i] = *reinterpret_cast<const uint4*>(step.page + static_cast<int64_t>(t) * head_dim + c0);
      r.v[i] = *reinterpret_cast<const uint4*>(
          step.page + static_cast<int64_t>(page_size + t) * head_dim + c0);
    }
  }
}

// The online softmax over a step's loaded tokens.
template <typename T, int L, int G>
__device__ __forceinline__ void ComputeStep(const StepLoads<G>& r, int32_t t0, int32_t tokens,
                                            int slot, LaneState<T, G>& s) {
  constexpr int kV = kVec<T>, kPerLoad = 32 / L, kN = kLoads<G>;
  float score[kN][G];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float k[kV];
    UnpackAs<T>(r.k[i], k);
    const bool valid = t0 + i * kPerLoad + slot < tokens;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kV; ++c) dot += s.q[g][c] * k[c];
#pragma unroll
      for (int offset = L / 2; offset > 0; offset >>= 1) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      score[i][g] = valid ? dot : -INFINITY;
    }
  }
  // Token 0 of the step is valid, so every head's step max is finite.
  float correction[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float top = score[0][g];
#pragma unroll
    for (int i = 1; i < kN; ++i) top = fmaxf(top, score[i][g]);
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1) {
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    }
    const float m_new = fmaxf(s.m[g], top);
    correction[g] = exp2f(s.m[g] - m_new);  // 0 on the first step (m = -inf)
    s.m[g] = m_new;
    s.l[g] *= correction[g];
#pragma unroll
    for (int c = 0; c < kV; ++c) s.acc[g][c] *= correction[g];
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float v[kV];
    UnpackAs<T>(r.v[i], v);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float weight = exp2f(score[i][g] - s.m[g]);  // 0 for an invalid token
      s.l[g] += weight;
#pragma unroll
      for (int c = 0; c < kV; ++c) s.acc[g][c] += weight * v[c];
    }
  }
}

// The entries of a block's split a warp takes, first + k * kWarps for k = 0, 1, ...: lane j holds
// the address and tokens of entry k = 32 * window + j, so one round of (dependent) page-table
// loads serves the warp's next 32 pages instead of one each.
template <typename Lists>
struct WarpEntries {
  const Lists& lists;
  int32_t row, kv_head, first, end;
  int lane;
  unsigned long long page = 0;  // this lane's entry's address in the current window
  int32_t tokens = 0;
  int32_t window = -1;

  // Entry k's address and tokens, for a warp-uniform k; false past the split's end.
  __device__ __forceinline__ bool Get(int32_t k, const char** address, int32_t* count) {
    if (first + k * kWarps >= end) return false;
    if (k / 32 != window) {
      window = k / 32;
      const int32_t e = first + (window * 32 + lane) * kWarps;
      tokens = 0;
      page = 0;
      if (e < end) page = reinterpret_cast<uintptr_t>(lists.entry(row, kv_head, e, &tokens));
    }
    *address = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, page, k % 32));
    *count = __shfl_sync(0xffffffffu, tokens, k % 32);
    return true;
  }
};

// The step after `step` (warp-uniform): the next tokens of its page, else the next entry with
// tokens; invalid past the warp's last entry.
template <typename T, int kStep, typename Lists>
__device__ __forceinline__ Step<T> NextStep(Step<T> step, WarpEntries<Lists>& entries) {
  step.t0 += kStep;
  while (step.t0 >= step.tokens) {
    const char* address;
    if (!entries.Get(++step.k, &address, &step.tokens)) {
      step.valid = false;
      return step;
    }
    step.page = reinterpret_cast<const T*>(address);
    step.t0 = 0;
  }
  return step;
}

// grid (rows * num_kv_heads, splits, query-head chunks of G), kWarps * 32 threads.
template <typename Lists, typename T, int L, int G>
__global__ void __launch_bounds__(kWarps * 32)
    VectorAttentionKernel(AttentionCommon p, Lists lists, int32_t splits) {
  AfterPriorGrids();  // a dependent launch (dependent_launch.cuh)
  constexpr int kV = kVec<T>, kDim = L * kV, kStep = 32 / L * kLoads<G>;
  __shared__ WarpPartials<kWarps, G, kDim> partials;

  const auto [row, kv_head, head0, heads, e_begin, e_end] = BlockPartOf(p, lists, splits, G);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slot = lane / L, c0 = lane % L * kV;

  LaneState<T, G> s;
  const float q_scale = p.scale * kLog2E;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    s.m[g] = -INFINITY;
    s.l[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < kV; ++c) {
      s.acc[g][c] = 0.0f;
      s.q[g][c] = g < heads && c0 < p.head_dim
                      ? p.q[row * p.q_stride + static_cast<int64_t>(head0 + g) * p.head_dim + c0 +
                            c] *
                            q_scale
                      : 0.0f;
    }
  }
  // Software-pipelined: the next step's loads are issued before the current step computes.
  WarpEntries<Lists> entries{lists, row, kv_head, e_begin + warp, e_end, lane};
  Step<T> step = NextStep<T, kStep>(Step<T>{}, entries);
  StepLoads<G> now{}, next{};
  if (step.valid) LoadStep<T, L, G>(step, p.page_size, p.head_dim, slot, c0, now);
  while (step.valid) {
    const Step<T> following = NextStep<T, kStep>(step, entries);
    if (following.valid) LoadStep<T, L, G>(following, p.page_size, p.head_dim, slot, c0, next);
    ComputeStep<T, L, G>(now, step.t0, step.tokens, slot, s);
    now = next;
    step = following;
  }

  // Merge the token slots of the warp (lanes with the same channels), then the warps.
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1) {
      s.l[g] += __shfl_xor_sync(0xffffffffu, s.l[g], offset);
#pragma unroll
      for (int c = 0; c < kV; ++c) s.acc[g][c] += __shfl_xor_sync(0xffffffffu, s.acc[g][c], offset);
    }
    if (g < heads && slot == 0) {
      if (lane == 0) {
        partials.m[warp][g] = s.m[g];
        partials.l[warp][g] = s.l[g];
      }
      if (c0 < p.head_dim) {
#pragma unroll
        for (int c = 0; c < kV; ++c) partials.acc[warp][g][c0 + c] = s.acc[g][c];
      }
    }
  }
  __syncthreads();
  MergeWarpsAndWrite</*kLog2=*/true>(p, partials, row, head0, heads, splits);
}

// Lanes per token row for head_dim elements of T: 8, 16 or 32, or 0 when this kernel does not
// serve the shape (the row must split into 16-byte loads over at most 32 lanes).
template <typename T>
inline int LanesPerToken(int32_t head_dim) {
  if (head_dim % kVec<T> != 0) return 0;
  for (int lanes : {8, 16, 32}) {
    if (head_dim / kVec<T> <= lanes) return lanes;
  }
  return 0;
}

}  // namespace specula::kernels::vector_attention
