// The last stage of both decode attention kernels of attention.cu: each warp's softmax state
// (running max, sum, unnormalized accumulator) is left in shared memory, merged per (query head,
// channel) across the block's warps, and written to the output (one split) or to the split-K
// scratch of kernels/attention.h (max in natural-log units) for CombineAttentionSplits.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace specula::kernels {

template <int kWarpCount, int kHeads, int kDim>
struct WarpPartials {
  float m[kWarpCount][kHeads];  // -inf for a warp that saw no key
  float l[kWarpCount][kHeads];
  float acc[kWarpCount][kHeads][kDim];
};

// After a __syncthreads that follows the warps' writes. kLog2: the maxima are in log2 units (the
// kernel's softmax ran on exp2).
template <bool kLog2, int kWarpCount, int kHeads, int kDim>
__device__ __forceinline__ void MergeWarpsAndWrite(const AttentionCommon& p,
                                                   const WarpPartials<kWarpCount, kHeads, kDim>& w,
                                                   int32_t row, int64_t head0, int32_t heads,
                                                   int32_t splits) {
  for (int idx = threadIdx.x; idx < heads * p.head_dim; idx += blockDim.x) {
    const int g = idx / p.head_dim, c = idx % p.head_dim;
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kWarpCount; ++i) m = fmaxf(m, w.m[i][g]);
    float l = 0.0f, a = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kWarpCount; ++i) {
        if (w.m[i][g] == -INFINITY) continue;
        const float f = kLog2 ? exp2f(w.m[i][g] - m) : expf(w.m[i][g] - m);
        l += w.l[i][g] * f;
        a += w.acc[i][g][c] * f;
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
        constexpr float kLn2 = 0.6931471805599453f;
        p.scratch[slot] = kLog2 && m != -INFINITY ? m * kLn2 : m;
        p.scratch[slots + slot] = l;
      }
      p.scratch[2 * slots + slot * p.head_dim + c] = a;
    }
  }
}

}  // namespace specula::kernels
