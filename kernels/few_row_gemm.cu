#include <cuda_bf16.h>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/few_row_gemm.h"

namespace specula::kernels {
namespace {

constexpr int kWarps = 16;
constexpr int kChunkK = 32;  // k a lane's 16-byte loads cover across its 4 lanes: two k16 steps
constexpr int kUnroll = 2;   // chunks a warp loads before it multiplies any

// One warp's loads for kUnroll chunks: per chunk and tile, rows g and g + 8 of W; per chunk, row
// g of x (zeros past the rows, the columns, or the chunks).
template <int kTiles>
struct Loads {
  uint4 w[kUnroll][kTiles][2];
  uint4 x[kUnroll];
};

// d += a · b for one m16n8k16 tile: a row-major 16x16, b column-major 16x8, d fp32 16x8.
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Where a lane's data sits: its W rows (per tile, g and g + 8), its x row g, its 16 bytes t.
struct LaneMap {
  const uint4* w_row[2][2];  // [tile][half]; null past the last column
  const uint4* x_row;        // null past the last row
  int t;
};

template <int kTiles>
__device__ __forceinline__ void LoadWeights(const LaneMap& l, int32_t c0, int32_t chunks,
                                            Loads<kTiles>& ld) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t c = c0 + u * kWarps;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* row = l.w_row[tile][h];
        ld.w[u][tile][h] =
            c < chunks && row != nullptr ? __ldg(row + c * 4 + l.t) : make_uint4(0, 0, 0, 0);
      }
    }
  }
}

template <int kTiles>
__device__ __forceinline__ void LoadX(const LaneMap& l, int32_t c0, int32_t chunks,
                                      Loads<kTiles>& ld) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int32_t c = c0 + u * kWarps;
    ld.x[u] = c < chunks && l.x_row != nullptr ? l.x_row[c * 4 + l.t] : make_uint4(0, 0, 0, 0);
  }
}

// Lane (g, t) holds k's 8t..8t+7 of the chunk: the first k16 step takes 8t+{0,1} as its slots
// 2t+{0,1} and 8t+{2,3} as 2t+8+{0,1}; the second 8t+{4..7} likewise. The slot-to-k map depends
// on the slot alone, and W and x use it alike, so the products are those of the chunk's k's.
template <int kTiles>
__device__ __forceinline__ void Multiply(const Loads<kTiles>& ld, float (&acc)[kTiles][4]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint4 x = ld.x[u];
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const uint4 lo = ld.w[u][tile][0], hi = ld.w[u][tile][1];
      Mma(acc[tile], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
      Mma(acc[tile], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
    }
  }
}

// Sums the warps' accumulators in warp order and writes y (+ bias). Accumulator element e of lane
// (g, t) in a tile is output column g (+ 8 for e >= 2) of the tile, x row 2t + e % 2.
template <int kTiles>
__device__ __forceinline__ void ReduceAndStore(const FewRowGemmParams& p, int64_t o0,
                                               const float (&acc)[kTiles][4]) {
  __shared__ float4 partial[kWarps][kTiles][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    partial[warp][tile][lane] = make_float4(acc[tile][0], acc[tile][1], acc[tile][2], acc[tile][3]);
  }
  __syncthreads();
  const int i = threadIdx.x;
  if (i >= kTiles * 32 * 4) return;
  const int tile = i / 128, l = (i / 4) % 32, e = i % 4;
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += reinterpret_cast<const float*>(&partial[w][tile][l])[e];
  const int64_t o = o0 + 16 * tile + l / 4 + (e >= 2 ? 8 : 0);
  const int32_t n = 2 * (l % 4) + e % 2;
  if (n < p.m && o < p.out) p.y[n * p.y_stride + o] = sum + (p.bias != nullptr ? p.bias[o] : 0.0f);
}

// grid ceil(out / (16 * kTiles)), kWarps warps; warp w takes the chunks w, w + kWarps, ... of the
// block's column tiles.
template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) FewRowGemmKernel(FewRowGemmParams p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * 16 * kTiles;
  const int64_t row_chunks = p.in / 8;  // 16-byte chunks of a row
  LaneMap l;
  l.t = lane % 4;
  const auto* w = static_cast<const uint4*>(p.w);
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t o = o0 + 16 * tile + g + 8 * h;
      l.w_row[tile][h] = o < p.out ? w + o * row_chunks : nullptr;
    }
  }
  l.x_row = g < p.m ? static_cast<const uint4*>(p.x) + g * row_chunks : nullptr;
  const int32_t chunks = p.in / kChunkK;
  float acc[kTiles][4] = {};
  Loads<kTiles> ld;
  // Weights never depend on the kernel ahead; x does.
  LoadWeights(l, warp, chunks, ld);
  AfterPriorGrids();
  for (int32_t c0 = warp; c0 < chunks; c0 += kWarps * kUnroll) {
    if (c0 != warp) LoadWeights(l, c0, chunks, ld);
    LoadX(l, c0, chunks, ld);
    Multiply(ld, acc);
  }
  ReduceAndStore(p, o0, acc);
}

}  // namespace

bool FewRowGemmSupports(const FewRowGemmParams& p) {
  return p.m >= 2 && p.m <= kFewRowGemmMaxRows && p.in > 0 && p.in % kChunkK == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

// Two column tiles a block (each x load serving both) where that still makes two blocks an SM;
// one where it would leave SMs idle (a 2048-column projection: 64 blocks of two tiles).
cudaError_t FewRowGemm(const FewRowGemmParams& p, cudaStream_t stream) {
  if (!FewRowGemmSupports(p)) return cudaErrorInvalidValue;
  if (p.out == 0) return cudaSuccess;
  const int64_t wide_blocks = CeilDiv(p.out, 32);
  const dim3 block(kWarps * 32);
  if (wide_blocks >= 2 * static_cast<int64_t>(p.sm_count)) {
    return LaunchDependent<FewRowGemmKernel<2>>(dim3(static_cast<unsigned>(wide_blocks)), block, 0,
                                                stream, p);
  }
  return LaunchDependent<FewRowGemmKernel<1>>(dim3(static_cast<unsigned>(CeilDiv(p.out, 16))),
                                              block, 0, stream, p);
}

}  // namespace specula::kernels
