#include <algorithm>
#include <climits>

#include "kernels/attention.h"
#include "kernels/device_math.cuh"
#include "kernels/mma.cuh"
#include "kernels/prefill_attention.h"

namespace specula::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// A block's shape: each warp takes kAtoms 16-row slices of the query tile (sharing every K and V
// fragment it reads from shared memory among them), over K/V tiles of kKeys keys.
template <int D, int kAtomsPerWarp, int kKeysPerTile>
struct Shape {
  static constexpr int kHeadDim = D;
  static constexpr int kAtoms = kAtomsPerWarp;
  static constexpr int kKeys = kKeysPerTile;
  static constexpr int kRows = kWarps * 16 * kAtoms;               // query rows per block
  static constexpr size_t kSharedElems = (kRows + 4 * kKeys) * D;  // Q, then 2 x (K, V)
};

// Shared memory holds rows of D 16-bit elements in 16-byte chunks. Chunk c of row r sits at
// chunk c ^ (r % 8): the 8 rows an ldmatrix reads at one logical chunk land in 8 different bank
// groups, and so do cp.async's stores.
template <int D>
__device__ __forceinline__ int Swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; zero-filled when !valid.
__device__ __forceinline__ void CopyAsync16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(shared)),
               "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CommitAsync() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(shared)));
}
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(shared)));
}

// Two floats as one register of two 16-bit values, the first in the low half.
template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// What one block works on: S::kRows rows of one sequence, one query head.
struct Tile {
  int32_t row0;  // first row (batch row)
  int32_t rows;  // valid rows, <= S::kRows
  int32_t head;
  int32_t kv_head;
  const int32_t* table;  // the sequence's block table
  int32_t max_keys;      // the most keys any row of the tile sees
  int32_t min_keys;      // the fewest: key tiles below it need no mask
};

// Starts copying keys [key0, key0 + S::kKeys) of K and V into one buffer pair.
template <typename T, typename S>
__device__ __forceinline__ void LoadKvTile(const PrefillAttentionParams& p, const Tile& t,
                                           int32_t key0, T* sk, T* sv) {
  constexpr int D = S::kHeadDim, kChunks = D / 8;
  const int64_t page_elems = 2 * static_cast<int64_t>(p.page_size) * D;
  const T* base = static_cast<const T*>(p.kv_base);
#pragma unroll
  for (int i = threadIdx.x; i < S::kKeys * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int32_t key = key0 + r;
    const bool valid = key < t.max_keys;
    const T* k = base;
    if (valid) {
      const int64_t page =
          static_cast<int64_t>(t.table[key / p.page_size]) * p.num_kv_heads + t.kv_head;
      k = base + page * page_elems + static_cast<int64_t>(key % p.page_size) * D + c * 8;
    }
    CopyAsync16(sk + Swizzled<D>(r, c), k, valid);
    CopyAsync16(sv + Swizzled<D>(r, c), valid ? k + static_cast<int64_t>(p.page_size) * D : k,
                valid);
  }
}

// The tile's rows of Q (fp32 in global memory) as T in shared memory; rows past the sequence 0.
template <typename T, typename S>
__device__ __forceinline__ void StoreQ(const PrefillAttentionParams& p, const Tile& t, T* sq) {
  constexpr int D = S::kHeadDim, kChunks = D / 8;
  for (int i = threadIdx.x; i < S::kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    float v[8] = {};
    if (r < t.rows) {
      const float* q = p.q + static_cast<int64_t>(t.row0 + r) * p.q_stride +
                       static_cast<int64_t>(t.head) * D + c * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = q[e];
    }
    uint4 packed;
    packed.x = Pack<T>(v[0], v[1]);
    packed.y = Pack<T>(v[2], v[3]);
    packed.z = Pack<T>(v[4], v[5]);
    packed.w = Pack<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(sq + Swizzled<D>(r, c)) = packed;
  }
}

// The block row of a warp's atom a, half h (rows g and g + 8 of the atom's 16, g = lane / 4).
__device__ __forceinline__ int RowOf(int atom, int half) {
  return (threadIdx.x / 32 * 16 + 64 * atom) + (threadIdx.x % 32) / 4 + 8 * half;
}

// Online-softmax state of one thread, per atom: rows RowOf(a, 0) and RowOf(a, 1), the output's
// columns 8 * j + 2 * (lane % 4) + {0, 1} of each 8-column tile j.
template <typename S>
struct Accumulator {
  float o[S::kAtoms][S::kHeadDim / 8][4];
  float m[S::kAtoms][2];  // running max of the scaled scores (log2 units)
  float l[S::kAtoms][2];  // this thread's part of the running sum
};

template <typename S>
using QFragments = uint32_t[S::kAtoms][S::kHeadDim / 16][4];

// S = Q Kᵀ for one K tile, each K fragment read once and used by every atom.
template <typename T, typename S>
__device__ __forceinline__ void Scores(const QFragments<S>& qf, const T* sk,
                                       float (&s)[S::kAtoms][S::kKeys / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int a = 0; a < S::kAtoms; ++a) {
#pragma unroll
    for (int j = 0; j < S::kKeys / 8; ++j) s[a][j][0] = s[a][j][1] = s[a][j][2] = s[a][j][3] = 0;
  }
#pragma unroll
  for (int ks = 0; ks < S::kHeadDim / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < S::kKeys / 16; ++np) {
      uint32_t b[4];
      const int key = np * 16 + (lane % 8) + (lane / 16) * 8;
      LoadMatrices(b, sk + Swizzled<S::kHeadDim>(key, ks * 2 + (lane / 8) % 2));
#pragma unroll
      for (int a = 0; a < S::kAtoms; ++a) {
        Mma<T>(s[a][2 * np], qf[a][ks], b[0], b[1]);
        Mma<T>(s[a][2 * np + 1], qf[a][ks], b[2], b[3]);
      }
    }
  }
}

// Scales and masks one atom's scores, updates its running max and sum, rescales its output, and
// returns P in the A-operand layout (that of two 8-key accumulator tiles is the A layout of 16).
template <typename T, typename S>
__device__ __forceinline__ void Softmax(float (&s)[S::kKeys / 8][4], int32_t key0, bool masked,
                                        const int32_t (&row_keys)[2], float scale_log2,
                                        float (&o)[S::kHeadDim / 8][4], float (&m)[2],
                                        float (&l)[2], uint32_t (&pf)[S::kKeys / 16][4]) {
  const int t4 = threadIdx.x % 4;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < S::kKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2;
      float x = s[j][e] * scale_log2;
      if (masked && key0 + j * 8 + 2 * t4 + (e % 2) >= row_keys[half]) x = -INFINITY;
      s[j][e] = x;
      tile_max[half] = fmaxf(tile_max[half], x);
    }
  }
  float correction[2], base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float m_new = fmaxf(m[h], tile_max[h]);
    base[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: keep 0, not NaN
    correction[h] = exp2f(m[h] - base[h]);
    m[h] = m_new;
    l[h] *= correction[h];
  }
#pragma unroll
  for (int j = 0; j < S::kHeadDim / 8; ++j) {
    o[j][0] *= correction[0];
    o[j][1] *= correction[0];
    o[j][2] *= correction[1];
    o[j][3] *= correction[1];
  }
#pragma unroll
  for (int j = 0; j < S::kKeys / 8; ++j) {
    const float p0 = exp2f(s[j][0] - base[0]), p1 = exp2f(s[j][1] - base[0]);
    const float p2 = exp2f(s[j][2] - base[1]), p3 = exp2f(s[j][3] - base[1]);
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    pf[j / 2][(j % 2) * 2] = Pack<T>(p0, p1);
    pf[j / 2][(j % 2) * 2 + 1] = Pack<T>(p2, p3);
  }
}

// One K/V tile: S = Q Kᵀ (scaled to log2 units, masked), the online softmax, O += P V.
template <typename T, typename S>
__device__ __forceinline__ void AttendTile(const QFragments<S>& qf, const T* sk, const T* sv,
                                           int32_t key0, bool masked,
                                           const int32_t (&row_keys)[S::kAtoms][2],
                                           float scale_log2, Accumulator<S>& acc) {
  const int lane = threadIdx.x % 32;
  float s[S::kAtoms][S::kKeys / 8][4];
  Scores<T, S>(qf, sk, s);
  uint32_t pf[S::kAtoms][S::kKeys / 16][4];
#pragma unroll
  for (int a = 0; a < S::kAtoms; ++a) {
    Softmax<T, S>(s[a], key0, masked, row_keys[a], scale_log2, acc.o[a], acc.m[a], acc.l[a], pf[a]);
  }
#pragma unroll
  for (int kk = 0; kk < S::kKeys / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < S::kHeadDim / 16; ++dp) {
      uint32_t b[4];
      const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
      LoadMatricesTransposed(b, sv + Swizzled<S::kHeadDim>(key, dp * 2 + lane / 16));
#pragma unroll
      for (int a = 0; a < S::kAtoms; ++a) {
        Mma<T>(acc.o[a][2 * dp], pf[a][kk], b[0], b[1]);
        Mma<T>(acc.o[a][2 * dp + 1], pf[a][kk], b[2], b[3]);
      }
    }
  }
}

// The block's tile, its rows' key counts reduced in shared memory.
template <typename S, bool kSplit>
__device__ __forceinline__ bool FindTile(const PrefillAttentionParams& p, Tile* t) {
  __shared__ int32_t max_keys, min_keys;
  const int32_t seq = blockIdx.z;
  const int32_t seq_begin = p.seq_rows[seq], seq_end = p.seq_rows[seq + 1];
  // Heavy tiles (the sequence's last rows, most keys) first: they set the kernel's tail.
  t->row0 = seq_begin + (gridDim.y - 1 - blockIdx.y) * S::kRows;
  if (t->row0 >= seq_end) return false;
  t->rows = min(S::kRows, seq_end - t->row0);
  t->head = kSplit ? blockIdx.x % p.num_heads : blockIdx.x;
  t->kv_head = t->head / (p.num_heads / p.num_kv_heads);
  t->table = p.blocks + p.row_block_begin[t->row0];
  if (threadIdx.x == 0) {
    max_keys = 0;
    min_keys = INT_MAX;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < t->rows; r += kThreads) {
    const int32_t keys = p.row_keys[t->row0 + r];
    atomicMax(&max_keys, keys);
    atomicMin(&min_keys, keys);
  }
  __syncthreads();
  t->max_keys = max_keys;
  t->min_keys = min_keys;
  return true;
}

// Calls write(row, atom, half, sum) for each batch row this thread holds in the tile, with the
// row's softmax sum gathered from the 4 threads that share it.
template <typename S, typename Write>
__device__ __forceinline__ void ForEachRow(const Tile& t, const Accumulator<S>& acc, Write write) {
#pragma unroll
  for (int a = 0; a < S::kAtoms; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = acc.l[a][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = RowOf(a, h);
      if (r < t.rows) write(static_cast<int64_t>(t.row0 + r), a, h, l);
    }
  }
}

// The thread's output columns 8 * j + 2 * (lane % 4) + {0, 1} of row (a, h), times `factor`.
template <typename S>
__device__ __forceinline__ void StoreColumns(float* row_out, const Accumulator<S>& acc, int a,
                                             int h, float factor) {
  float* out = row_out + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < S::kHeadDim / 8; ++j) {
    out[j * 8] = acc.o[a][j][2 * h] * factor;
    out[j * 8 + 1] = acc.o[a][j][2 * h + 1] * factor;
  }
}

template <typename S>
__device__ __forceinline__ void StoreOut(const PrefillAttentionParams& p, const Tile& t,
                                         const Accumulator<S>& acc) {
  ForEachRow<S>(t, acc, [&](int64_t row, int a, int h, float l) {
    StoreColumns<S>(p.out + row * p.out_stride + static_cast<int64_t>(t.head) * S::kHeadDim, acc, a,
                    h, l > 0.0f ? 1.0f / l : 0.0f);
  });
}

// Split-K: the tile's unnormalized output, running max (natural-log units) and sum for this
// split, in the layout CombineAttentionSplits merges (attention.h).
template <typename S>
__device__ __forceinline__ void StorePartial(const PrefillAttentionParams& p, const Tile& t,
                                             const Accumulator<S>& acc, int32_t split,
                                             int32_t splits) {
  const int64_t slots = static_cast<int64_t>(p.rows) * p.num_heads * splits;
  ForEachRow<S>(t, acc, [&](int64_t row, int a, int h, float l) {
    const int64_t slot = (row * p.num_heads + t.head) * splits + split;
    if (threadIdx.x % 4 == 0) {
      p.scratch[slot] = acc.m[a][h] * 0.6931471805599453f;  // log2 units to natural
      p.scratch[slots + slot] = l;
    }
    StoreColumns<S>(p.scratch + 2 * slots + slot * S::kHeadDim, acc, a, h, 1.0f);
  });
}

// kSplit: the grid's x is num_heads * splits and each block takes one split of the key tiles
// (written as a partial result); otherwise x is num_heads and splits is 1.
template <typename T, typename S, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    PrefillKernel(PrefillAttentionParams p, int32_t splits) {
  constexpr int D = S::kHeadDim, kKvElems = S::kKeys * D;
  extern __shared__ uint4 shared_raw[];
  T* sq = reinterpret_cast<T*>(shared_raw);
  T* sk = sq + S::kRows * D;  // two buffers of kKeys x D
  T* sv = sk + 2 * kKvElems;  // likewise
  Tile t;
  if (!FindTile<S, kSplit>(p, &t)) return;
  const int lane = threadIdx.x % 32;
  // This block's split of the key tiles (all of them without split-K).
  const int32_t key_tiles = (t.max_keys + S::kKeys - 1) / S::kKeys;
  int32_t split = 0, kt_begin = 0, kt_end = key_tiles;
  if constexpr (kSplit) {
    split = blockIdx.x / p.num_heads;
    const int32_t per_split = (key_tiles + splits - 1) / splits;
    kt_begin = min(key_tiles, split * per_split);
    kt_end = min(key_tiles, kt_begin + per_split);
  }

  StoreQ<T, S>(p, t, sq);
  if (kt_begin < kt_end) LoadKvTile<T, S>(p, t, kt_begin * S::kKeys, sk, sv);
  CommitAsync();
  __syncthreads();  // Q is in shared memory
  QFragments<S> qf;
  int32_t row_keys[S::kAtoms][2];
  Accumulator<S> acc;
#pragma unroll
  for (int a = 0; a < S::kAtoms; ++a) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int row = RowOf(a, 0) - (lane / 4) + (lane % 8) + ((lane / 8) % 2) * 8;
      LoadMatrices(qf[a][ks], sq + Swizzled<D>(row, ks * 2 + lane / 16));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = RowOf(a, h);
      row_keys[a][h] = r < t.rows ? p.row_keys[t.row0 + r] : 0;
      acc.m[a][h] = -INFINITY;
      acc.l[a][h] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      acc.o[a][j][0] = acc.o[a][j][1] = acc.o[a][j][2] = acc.o[a][j][3] = 0.0f;
    }
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;
  for (int32_t kt = kt_begin; kt < kt_end; ++kt) {
    const int buf = (kt - kt_begin) & 1;
    if (kt + 1 < kt_end) {
      LoadKvTile<T, S>(p, t, (kt + 1) * S::kKeys, sk + (buf ^ 1) * kKvElems,
                       sv + (buf ^ 1) * kKvElems);
    }
    CommitAsync();
    WaitAsync<1>();  // all but the newest group: tile kt has landed
    __syncthreads();
    const int32_t key0 = kt * S::kKeys;
    AttendTile<T, S>(qf, sk + buf * kKvElems, sv + buf * kKvElems, key0,
                     key0 + S::kKeys > t.min_keys, row_keys, scale_log2, acc);
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }
  if constexpr (kSplit) {
    StorePartial<S>(p, t, acc, split, splits);
  } else {
    StoreOut<S>(p, t, acc);
  }
}

template <typename T, typename S>
constexpr size_t kSharedBytes = S::kSharedElems * sizeof(T);

// Lets the kernel take its shared memory (over the default 48 KiB at head_dim 128), once.
template <typename T, typename S, bool kSplit>
cudaError_t Configure() {
  static const cudaError_t configured = cudaFuncSetAttribute(
      PrefillKernel<T, S, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes<T, S>);
  return configured;
}

template <typename T, typename S, bool kSplit>
cudaError_t LaunchKernel(const PrefillAttentionParams& p, int32_t splits, cudaStream_t stream) {
  if (cudaError_t e = Configure<T, S, kSplit>(); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.num_heads * splits),
                  static_cast<unsigned>(CeilDiv(p.max_seq_rows, S::kRows)),
                  static_cast<unsigned>(p.seqs));
  PrefillKernel<T, S, kSplit><<<grid, kThreads, kSharedBytes<T, S>, stream>>>(p, splits);
  return LaunchStatus();
}

// The tile kernel with `splits` splits of the key tiles, and the merge when there are several.
template <typename T, typename S>
cudaError_t LaunchSplit(const PrefillAttentionParams& p, int32_t splits, cudaStream_t stream) {
  if (splits == 1) return LaunchKernel<T, S, false>(p, 1, stream);
  if (cudaError_t e = LaunchKernel<T, S, true>(p, splits, stream); e != cudaSuccess) return e;
  AttentionCommon c;
  c.out = p.out;
  c.out_stride = p.out_stride;
  c.rows = p.rows;
  c.num_heads = p.num_heads;
  c.head_dim = p.head_dim;
  c.scratch = p.scratch;
  return CombineAttentionSplits(c, splits, stream);
}

// Blocks of the kernel resident on one SM (registers and shared memory allow).
template <typename T, typename S>
int ResidentBlocksPerSm() {
  static const int blocks = [] {
    int n = 1;
    if (Configure<T, S, false>() != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, PrefillKernel<T, S, false>, kThreads,
                                                      kSharedBytes<T, S>) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    return std::max(n, 1);
  }();
  return blocks;
}

// Splits of the key tiles when `blocks` fill at most half of one wave of the GPU: as many as
// whole waves allow, each of at least 4 key tiles of S::kKeys, or of at least 16 when fewer than
// 4 splits are possible. Each split block repeats the prologue (Q to shared memory and registers)
// and the merge is a second launch: on an H100, two splits of a 512-row chunk over 1K keys ran
// 16% slower, over 8K-32K keys 16-25% faster; five splits of a 65-row chunk over 1,440 keys took
// the agent suffix probe from 1.34x to 1.10x of no prefix. At head_dim 128 two blocks fit an SM,
// so 256 blocks already fill a wave (splitting them cost 7-25%).
template <typename T, typename S>
int32_t ChooseSplits(const PrefillAttentionLaunch& l, int64_t blocks) {
  const PrefillAttentionParams& p = l.params;
  if (p.scratch == nullptr) return 1;
  const int64_t wave = static_cast<int64_t>(p.sm_count) * ResidentBlocksPerSm<T, S>();
  int64_t splits = std::min<int64_t>(wave / blocks, l.max_keys / (4 * S::kKeys));
  if (splits < 4) splits = std::min<int64_t>(splits, l.max_keys / (16 * S::kKeys));
  return SplitsWithinScratch(p.rows, p.num_heads, p.head_dim, splits, l.scratch_floats);
}

// Two shapes per head size: large tiles (two 16-row atoms per warp, 128 rows) share each K/V
// fragment between twice the rows and run 7-22% faster on long whole prompts (H100, 2026-11-26),
// but give half the blocks: a 512-row chunk then leaves SMs idle and runs up to 25% slower. So a
// launch takes the large tiles only when they still make two blocks per SM. At head_dim 128 the
// large tiles take 32-key K/V tiles to fit in 255 registers.
template <int D>
struct Shapes;
template <>
struct Shapes<64> {
  using Large = Shape<64, 2, 64>;
  using Small = Shape<64, 1, 64>;
};
template <>
struct Shapes<128> {
  using Large = Shape<128, 2, 32>;
  using Small = Shape<128, 1, 64>;
};

template <typename T, int D>
cudaError_t LaunchForHeadDim(const PrefillAttentionLaunch& l, cudaStream_t stream) {
  using Large = typename Shapes<D>::Large;
  using Small = typename Shapes<D>::Small;
  const PrefillAttentionParams& p = l.params;
  const int64_t tiles = static_cast<int64_t>(p.num_heads) * p.seqs;
  const int64_t large_blocks = tiles * CeilDiv(p.max_seq_rows, Large::kRows);
  if (large_blocks >= 2 * static_cast<int64_t>(p.sm_count)) {
    return LaunchKernel<T, Large, false>(p, 1, stream);
  }
  const int64_t small_blocks = tiles * CeilDiv(p.max_seq_rows, Small::kRows);
  return LaunchSplit<T, Small>(p, ChooseSplits<T, Small>(l, small_blocks), stream);
}

template <typename T>
cudaError_t LaunchForType(const PrefillAttentionLaunch& l, cudaStream_t stream) {
  return l.params.head_dim == 64 ? LaunchForHeadDim<T, 64>(l, stream)
                                 : LaunchForHeadDim<T, 128>(l, stream);
}

}  // namespace

bool PrefillAttentionSupports(DType dtype, int32_t head_dim) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && (head_dim == 64 || head_dim == 128);
}

cudaError_t PrefillAttention(const PrefillAttentionLaunch& l, cudaStream_t stream) {
  const PrefillAttentionParams& p = l.params;
  if (p.seqs == 0 || p.max_seq_rows == 0) return cudaSuccess;
  constexpr int kMinRows = 64;  // the small shapes' rows: the most tiles a launch can have
  if (!PrefillAttentionSupports(p.dtype, p.head_dim) || p.num_heads < 1 || p.num_kv_heads < 1 ||
      p.num_heads % p.num_kv_heads != 0 || p.page_size < 1 || p.seqs > 65535 ||
      p.num_heads > 65535 || CeilDiv(p.max_seq_rows, kMinRows) > 65535) {
    return cudaErrorInvalidValue;
  }
  return p.dtype == DType::kBF16 ? LaunchForType<__nv_bfloat16>(l, stream)
                                 : LaunchForType<__half>(l, stream);
}

}  // namespace specula::kernels
