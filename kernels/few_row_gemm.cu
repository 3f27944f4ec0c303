#include <cuda_bf16.h>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/few_row_gemm.h"
#include "kernels/mma.cuh"

namespace specula::kernels {
namespace {

constexpr int kWarps = 16;
constexpr int kChunkK = 32;  // k a lane's 16-byte loads cover across its 4 lanes: two k16 steps
constexpr int kUnroll = 2;   // chunks a warp loads before it multiplies any

// A block's shape: kTiles tiles of 16 output columns (the MMA's M) by kRowTiles tiles of 8 rows
// of x (its N).
template <int kColumnTiles, int kXRowTiles>
struct Shape {
  static constexpr int kTiles = kColumnTiles;
  static constexpr int kRowTiles = kXRowTiles;
};

// One warp's loads for kUnroll chunks: per chunk and column tile, rows g and g + 8 of W; per chunk
// and row tile, row g of x (zeros past the rows, the columns, or the chunks).
template <typename S>
struct Loads {
  uint4 w[kUnroll][S::kTiles][2];
  uint4 x[kUnroll][S::kRowTiles];
};

// Where a lane's data sits: its W rows (per column tile, g and g + 8), its x rows (per row tile,
// g), its 16 bytes t of each chunk.
template <typename S>
struct LaneMap {
  const uint4* w_row[S::kTiles][2];  // null past the last column
  const uint4* x_row[S::kRowTiles];  // null past the last row
  int t;
};

template <typename S>
__device__ __forceinline__ void LoadWeights(const LaneMap<S>& l, int32_t c0, int32_t chunks,
                                            Loads<S>& ld) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t c = c0 + u * kWarps;
#pragma unroll
    for (int tile = 0; tile < S::kTiles; ++tile) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* row = l.w_row[tile][h];
        ld.w[u][tile][h] =
            c < chunks && row != nullptr ? __ldg(row + c * 4 + l.t) : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

template <typename S>
__device__ __forceinline__ void LoadX(const LaneMap<S>& l, int32_t c0, int32_t chunks,
                                      Loads<S>& ld) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t c = c0 + u * kWarps;
#pragma unroll
    for (int r = 0; r < S::kRowTiles; ++r) {
      const uint4* row = l.x_row[r];
      ld.x[u][r] = c < chunks && row != nullptr ? row[c * 4 + l.t] : make_uint4(0, 0, 0, 0);
    }
  }
}

// Lane (g, t) holds k's 8t..8t+7 of the chunk: the first k16 step takes 8t+{0,1} as its slots
// 2t+{0,1} and 8t+{2,3} as 2t+8+{0,1}; the second 8t+{4..7} likewise. The slot-to-k map depends
// on the slot alone, and W and x use it alike, so the products are those of the chunk's k's.
template <typename S>
__device__ __forceinline__ void Multiply(const Loads<S>& ld,
                                         float (&acc)[S::kTiles][S::kRowTiles][4]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
    for (int tile = 0; tile < S::kTiles; ++tile) {
      const uint4 lo = ld.w[u][tile][0], hi = ld.w[u][tile][1];
#pragma unroll
      for (int r = 0; r < S::kRowTiles; ++r) {
        const uint4 x = ld.x[u][r];
        const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y}, second[4] = {lo.z, hi.z, lo.w, hi.w};
        Mma<__nv_bfloat16>(acc[tile][r], first, x.x, x.y);
        Mma<__nv_bfloat16>(acc[tile][r], second, x.z, x.w);
      }
    }
  }
}

// Sums the warps' accumulators in warp order and writes y (+ bias). Accumulator element e of lane
// (g, t) in a (column, row) tile pair is output column g (+ 8 for e >= 2) of the column tile, x
// row 2t + e % 2 of the row tile.
template <typename S>
__device__ __forceinline__ void ReduceAndStore(const FewRowGemmParams& p, int64_t o0,
                                               const float (&acc)[S::kTiles][S::kRowTiles][4]) {
  constexpr int kPairs = S::kTiles * S::kRowTiles;
  static_assert(kPairs * 32 * 4 <= kWarps * 32, "one thread a sum");
  __shared__ float4 partial[kWarps][kPairs][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int tile = 0; tile < S::kTiles; ++tile) {
#pragma unroll
    for (int r = 0; r < S::kRowTiles; ++r) {
      const float(&a)[4] = acc[tile][r];
      partial[warp][tile * S::kRowTiles + r][lane] = make_float4(a[0], a[1], a[2], a[3]);
    }
  }
  __syncthreads();
  const int i = threadIdx.x;
  if (i >= kPairs * 32 * 4) return;
  const int pair = i / 128, l = (i / 4) % 32, e = i % 4;
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += reinterpret_cast<const float*>(&partial[w][pair][l])[e];
  const int tile = pair / S::kRowTiles, r = pair % S::kRowTiles;
  const int64_t o = o0 + 16 * tile + l / 4 + (e >= 2 ? 8 : 0);
  const int32_t n = 8 * r + 2 * (l % 4) + e % 2;
  if (n < p.m && o < p.out) p.y[n * p.y_stride + o] = sum + (p.bias != nullptr ? p.bias[o] : 0.0f);
}

// grid ceil(out / (16 * kTiles)), kWarps warps; warp w takes the chunks w, w + kWarps, ... of the
// block's column tiles.
template <typename S>
__global__ void __launch_bounds__(kWarps * 32) FewRowGemmKernel(FewRowGemmParams p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * 16 * S::kTiles;
  const int64_t row_chunks = p.in / 8;  // 16-byte chunks of a row
  LaneMap<S> l;
  l.t = lane % 4;
  const auto* w = static_cast<const uint4*>(p.w);
#pragma unroll
  for (int tile = 0; tile < S::kTiles; ++tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t o = o0 + 16 * tile + g + 8 * h;
      l.w_row[tile][h] = o < p.out ? w + o * row_chunks : nullptr;
    }
  }
#pragma unroll
  for (int r = 0; r < S::kRowTiles; ++r) {
    const int n = 8 * r + g;
    l.x_row[r] = n < p.m ? static_cast<const uint4*>(p.x) + n * row_chunks : nullptr;
  }
  const int32_t chunks = p.in / kChunkK;
  float acc[S::kTiles][S::kRowTiles][4] = {};
  Loads<S> ld;
  // Weights never depend on the kernel ahead; x does.
  LoadWeights(l, warp, chunks, ld);
  AfterPriorGrids();
  for (int32_t c0 = warp; c0 < chunks; c0 += kWarps * kUnroll) {
    if (c0 != warp) LoadWeights(l, c0, chunks, ld);
    LoadX(l, c0, chunks, ld);
    Multiply(ld, acc);
  }
  ReduceAndStore<S>(p, o0, acc);
}

template <typename S>
cudaError_t Launch(const FewRowGemmParams& p, cudaStream_t stream) {
  return LaunchDependent<FewRowGemmKernel<S>>(
      dim3(static_cast<unsigned>(CeilDiv(p.out, 16 * S::kTiles))), dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

bool FewRowGemmSupports(const FewRowGemmParams& p) {
  return p.m >= 2 && p.m <= kFewRowGemmMaxRows && p.in > 0 && p.in % kChunkK == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

// Two column tiles a block (each x load serving both) where that still makes two blocks an SM;
// one where it would leave SMs idle (a 2048-column projection: 64 blocks of two tiles). Rows
// past 8 take a second row tile (each weight load serving both), with one column tile.
cudaError_t FewRowGemm(const FewRowGemmParams& p, cudaStream_t stream) {
  if (!FewRowGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.out == 0) return cudaSuccess;
  if (p.m > 8) return Launch<Shape<1, 2>>(p, stream);
  if (CeilDiv(p.out, 32) >= 2 * static_cast<int64_t>(p.sm_count)) {
    return Launch<Shape<2, 1>>(p, stream);
  }
  return Launch<Shape<1, 1>>(p, stream);
}

}  // namespace specula::kernels
