// The device sampler (kernels/sampling.h): one block per row of logits.
//
// Every ranking question the method asks ("which token is the k-th most likely", "where does the
// weight summed most likely first pass x") is answered by one radix descent over the logits'
// order keys: four passes of 256-bin histograms (of counts or of weights), each over the tokens
// that share the digits chosen so far, then, when several tokens share the chosen key, one pass
// over them in id order. No sort, no scratch memory beyond shared memory, O(vocab) per pass.
//
// Weights are fixed point (an integer number of units, 2^-46 of the most likely token's weight
// at a 128K vocabulary), so every sum is exact and the same in any thread order: a row draws the
// same token whichever batch it runs in. The CPU reference sums doubles; the two differ only
// where a draw lands within ~1e-13 of a boundary between two tokens.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_math.cuh"
#include "kernels/sampling.h"

namespace specula::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// An unsigned key in the logits' order: a larger logit has a larger key. NaN ranks with -inf
// (never above a real logit), -0 with +0 (they compare equal on the host).
__device__ __forceinline__ uint32_t RankKey(float v) {
  if (isnan(v)) v = -INFINITY;
  const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float KeyLogit(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}

// A prefix of the ranking (most likely first; ties: lower id first): every token whose key is
// above `key`, and the tokens of `key` whose id is at most `last_id`.
struct Boundary {
  uint32_t key;
  int32_t last_id;
};
constexpr Boundary kWholeRanking{0, INT_MAX};  // key 0 is below every sanitized logit's
__device__ __forceinline__ bool InPrefix(uint32_t key, int32_t id, Boundary b) {
  return key > b.key || (key == b.key && id <= b.last_id);
}
__device__ __forceinline__ Boundary Shorter(Boundary a, Boundary b) {
  return (a.key > b.key || (a.key == b.key && a.last_id < b.last_id)) ? a : b;
}

struct Row {
  const float* logits;
  int32_t vocab;
};

// Calls fn(id, logit) for each token of the row this thread visits (ids threadIdx.x, + kThreads,
// ..., rising) with kUnroll loads in flight: one block per row has too few warps to hide the
// latency of one L2 load at a time.
constexpr int kUnroll = 8;
template <typename Fn>
__device__ __forceinline__ void ForEachToken(Row row, Fn&& fn) {
  int32_t i = static_cast<int32_t>(threadIdx.x);
  for (; i + (kUnroll - 1) * kThreads < row.vocab; i += kUnroll * kThreads) {
    float l[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) l[u] = row.logits[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(i + u * kThreads, l[u]);
  }
  for (; i < row.vocab; i += kThreads) fn(i, row.logits[i]);
}

// Weights relative to the most likely token, computed as the host computes them (float
// difference and product, then exp rounded to float), and their fixed-point masses.
struct Weights {
  float max_logit;
  float inv_t;
  double unit;  // masses per unit of weight: the sum over the vocabulary stays below 2^63
  float min_p;
  __device__ float Weight(float logit) const {
    const float d = __fmul_rn(__fsub_rn(logit, max_logit), inv_t);
    return static_cast<float>(exp(static_cast<double>(d)));
  }
  __device__ uint64_t ToMass(float weight) const {
    return static_cast<uint64_t>(static_cast<double>(weight) * unit);
  }
  __device__ uint64_t Mass(float logit) const { return ToMass(Weight(logit)); }
  // The mass of a token min-p keeps, 0 for one it drops.
  __device__ uint64_t KeptMass(float logit) const {
    const float w = Weight(logit);
    return w >= min_p && w > 0.0f ? ToMass(w) : 0;
  }
};

struct CountOne {
  __device__ uint64_t operator()(float) const { return 1; }
};
struct MassOf {
  Weights w;
  __device__ uint64_t operator()(float logit) const { return w.Mass(logit); }
};

struct Shared {
  uint64_t hist[kWarps][kBins];  // a histogram per warp: fewer same-address atomics
  uint64_t bins[kBins];
  uint64_t warp_values[kWarps];
  double warp_sums[kWarps];
  uint32_t warp_keys[kWarps];
  int32_t warp_ids[kWarps];
  uint32_t digit;
  uint64_t above;
  int32_t found;
  int32_t count;
  uint32_t top_keys[kMaxSampledAlternatives];
  int32_t top_ids[kMaxSampledAlternatives];
};

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x & 31); }
__device__ __forceinline__ int Warp() { return static_cast<int>(threadIdx.x / 32); }

// The sum of `v` over this lane and the lanes below it.
__device__ uint64_t WarpInclusiveSum(uint64_t v) {
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(kFullMask, v, o);
    if (Lane() >= o) v += n;
  }
  return v;
}

// The sum of `v` over the threads before this one (thread order is id order for the callers'
// contiguous segments), and the block's total in *total.
__device__ uint64_t BlockExclusiveSum(uint64_t v, Shared& s, uint64_t* total) {
  const uint64_t inclusive = WarpInclusiveSum(v);
  if (Lane() == 31) s.warp_values[Warp()] = inclusive;
  __syncthreads();
  uint64_t before = 0;
  uint64_t all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < Warp()) before += s.warp_values[w];
    all += s.warp_values[w];
  }
  __syncthreads();
  *total = all;
  return before + inclusive - v;
}

// This thread's contiguous run of ids [begin, end), for passes that need id order.
struct Segment {
  int32_t begin;
  int32_t end;
};
__device__ Segment ThreadSegment(int32_t vocab) {
  const int32_t per = (vocab + kThreads - 1) / kThreads;
  const int32_t begin = min(vocab, static_cast<int32_t>(threadIdx.x) * per);
  return {begin, min(vocab, begin + per)};
}

// Calls fn(logit) for each token of `seg` in id order, kUnroll loads in flight.
template <typename Fn>
__device__ __forceinline__ void ForEachInSegment(Row row, Segment seg, Fn&& fn) {
  int32_t i = seg.begin;
  for (; i + kUnroll <= seg.end; i += kUnroll) {
    float l[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) l[u] = row.logits[i + u];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(l[u]);
  }
  for (; i < seg.end; ++i) fn(row.logits[i]);
}

struct RowStats {
  uint32_t best_key;  // the most likely token: its key and id (the lowest among equals)
  int32_t best_id;
  bool finite;
};

__device__ RowStats Stats(Row row, Shared& s) {
  uint32_t key = 0;
  int32_t id = INT_MAX;
  bool finite = true;
  ForEachToken(row, [&](int32_t i, float l) {
    finite = finite && l < INFINITY;  // not NaN, not +inf: -inf is a token never chosen
    const uint32_t k = RankKey(l);
    if (k > key) {  // ids rise within a thread: the first of equal keys stays
      key = k;
      id = i;
    }
  });
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t k = __shfl_xor_sync(kFullMask, key, o);
    const int32_t j = __shfl_xor_sync(kFullMask, id, o);
    if (k > key || (k == key && j < id)) {
      key = k;
      id = j;
    }
  }
  finite = __all_sync(kFullMask, finite);
  if (Lane() == 0) {
    s.warp_keys[Warp()] = key;
    s.warp_ids[Warp()] = id;
    s.warp_values[Warp()] = finite ? 1 : 0;
  }
  __syncthreads();
  RowStats out{0, INT_MAX, true};
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t k = s.warp_keys[w];
    if (k > out.best_key || (k == out.best_key && s.warp_ids[w] < out.best_id)) {
      out.best_key = k;
      out.best_id = s.warp_ids[w];
    }
    out.finite = out.finite && s.warp_values[w] != 0;
  }
  __syncthreads();
  return out;
}

// Warp 0, after a histogram pass: the digit (from the top) in whose bin the running sum passes
// `target`, and the sum of the bins above it, into s.digit and s.above. Lane l holds the bins
// 255 - 8l down to 248 - 8l.
__device__ void PickDigit(uint64_t target, uint64_t above, Shared& s) {
  uint64_t mine[8];
  uint64_t sum = 0;
  for (int i = 0; i < 8; ++i) {
    mine[i] = s.bins[kBins - 1 - 8 * Lane() - i];
    sum += mine[i];
  }
  const uint64_t inclusive = WarpInclusiveSum(sum);
  const unsigned passes = __ballot_sync(kFullMask, inclusive > target);
  // The callers keep `target` below the total, so some lane passes; the last is a safe default.
  const int first = passes != 0 ? __ffs(passes) - 1 : 31;
  if (Lane() == first) {
    uint64_t cum = inclusive - sum;
    int i = 0;
    while (i < 7 && cum + mine[i] <= target) cum += mine[i++];
    s.digit = static_cast<uint32_t>(kBins - 1 - 8 * first - i);
    s.above = above + cum;
  }
}

// The id of the `rank`-th token (0-based, in id order) whose key is `key`.
__device__ int32_t NthWithKey(Row row, uint32_t key, uint64_t rank, Shared& s) {
  const Segment seg = ThreadSegment(row.vocab);
  uint64_t count = 0;
  ForEachInSegment(row, seg, [&](float l) { count += RankKey(l) == key; });
  uint64_t total = 0;
  const uint64_t before = BlockExclusiveSum(count, s, &total);
  if (threadIdx.x == 0) s.found = INT_MAX;
  __syncthreads();
  if (before <= rank && rank < before + count) {
    uint64_t seen = before;
    for (int32_t i = seg.begin; i < seg.end; ++i) {
      if (RankKey(row.logits[i]) == key && seen++ == rank) {
        s.found = i;
        break;
      }
    }
  }
  __syncthreads();
  return s.found;
}

// The first token of the ranking at which the running sum of `measure` (most likely first)
// passes `x`: the prefix through it is the shortest whose measure exceeds x. x must be below
// the measure of the whole vocabulary.
template <typename Measure>
__device__ Boundary FindCrossing(Row row, Measure measure, uint64_t x, Shared& s) {
  uint32_t prefix = 0;
  uint32_t mask = 0;
  uint64_t above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kWarps * kBins; i += kThreads) (&s.hist[0][0])[i] = 0;
    __syncthreads();
    ForEachToken(row, [&](int32_t, float l) {
      const uint32_t k = RankKey(l);
      if ((k & mask) != prefix) return;
      const uint64_t m = measure(l);
      if (m != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[Warp()][(k >> shift) & 0xff]),
                  static_cast<unsigned long long>(m));
      }
    });
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      uint64_t t = 0;
      for (int w = 0; w < kWarps; ++w) t += s.hist[w][b];
      s.bins[b] = t;
    }
    __syncthreads();
    if (Warp() == 0) PickDigit(x - above, above, s);
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= 0xffu << shift;
    above = s.above;
    __syncthreads();
  }
  // Every token of key `prefix` weighs the same: the crossing is at a known rank among them.
  const uint64_t each = measure(KeyLogit(prefix));
  const uint64_t rank = each != 0 ? (x - above) / each : 0;
  return {prefix, NthWithKey(row, prefix, rank, s)};
}

// The sum of the masses of the tokens in the prefix `b`.
__device__ uint64_t MassThrough(Row row, Boundary b, const Weights& w, Shared& s) {
  uint64_t sum = 0;
  ForEachToken(row, [&](int32_t i, float l) {
    if (InPrefix(RankKey(l), i, b)) sum += w.Mass(l);
  });
  return BlockSum<kThreads>(sum, s.warp_values);
}

// The prefix of the tokens whose weight is at least min_p (weights fall along the ranking).
__device__ Boundary MinPBoundary(Row row, const Weights& w, Shared& s) {
  uint32_t lowest = UINT32_MAX;
  ForEachToken(row, [&](int32_t, float l) {
    if (w.Weight(l) >= w.min_p) lowest = min(lowest, RankKey(l));
  });
  lowest = WarpMin(lowest);
  if (Lane() == 0) s.warp_keys[Warp()] = lowest;
  __syncthreads();
  for (int i = 0; i < kWarps; ++i) lowest = min(lowest, s.warp_keys[i]);
  __syncthreads();
  return {lowest, INT_MAX};
}

// Temperature alone (min-p allowed): the inverse-CDF draw over the tokens in id order.
__device__ int32_t DrawInIdOrder(Row row, const Weights& w, double uniform, Shared& s) {
  const Segment seg = ThreadSegment(row.vocab);
  uint64_t mine = 0;
  ForEachInSegment(row, seg, [&](float l) { mine += w.KeptMass(l); });
  uint64_t total = 0;
  const uint64_t before = BlockExclusiveSum(mine, s, &total);
  const uint64_t x = min(static_cast<uint64_t>(uniform * static_cast<double>(total)), total - 1);
  if (threadIdx.x == 0) s.found = 0;
  __syncthreads();
  if (before <= x && x < before + mine) {
    uint64_t cum = before;
    for (int32_t i = seg.begin; i < seg.end; ++i) {
      cum += w.KeptMass(row.logits[i]);
      if (cum > x) {
        s.found = i;
        break;
      }
    }
  }
  __syncthreads();
  return s.found;
}

// A fixed-point unit that keeps the sum of `vocab` weights of at most 1 below 2^63.
__device__ double MassUnit(int32_t vocab) {
  const int bits = 32 - __clz(vocab);
  return ldexp(1.0, 63 - bits);
}

// Temperature > 0: the kept prefix (top-k, nucleus, min-p), then the draw over it.
__device__ int32_t Draw(Row row, const RowSampling& rs, float max_logit, Shared& s) {
  const Weights w{max_logit, 1.0f / rs.temperature, MassUnit(row.vocab), rs.min_p};
  const bool top_k = rs.top_k > 0 && rs.top_k < row.vocab;
  const bool top_p = rs.top_p < 1.0f;
  if (!top_k && !top_p) return DrawInIdOrder(row, w, rs.uniform, s);
  Boundary kept = kWholeRanking;
  if (top_k) kept = FindCrossing(row, CountOne{}, static_cast<uint64_t>(rs.top_k - 1), s);
  uint64_t kept_mass = MassThrough(row, kept, w, s);  // > 0: the top token weighs 1
  bool shortened = false;
  if (top_p) {
    // The nucleus is the shortest prefix whose mass reaches top_p of the kept mass.
    const double nucleus = ceil(static_cast<double>(rs.top_p) * static_cast<double>(kept_mass));
    const uint64_t x = nucleus >= 1.0 ? static_cast<uint64_t>(nucleus) - 1 : 0;
    kept = Shorter(kept, FindCrossing(row, MassOf{w}, min(x, kept_mass - 1), s));
    shortened = true;
  }
  if (rs.min_p > 0.0f) {
    kept = Shorter(kept, MinPBoundary(row, w, s));
    shortened = true;
  }
  if (shortened) kept_mass = MassThrough(row, kept, w, s);
  const uint64_t x =
      min(static_cast<uint64_t>(rs.uniform * static_cast<double>(kept_mass)), kept_mass - 1);
  return FindCrossing(row, MassOf{w}, x, s).last_id;
}

// log(sum(exp(logit - max))) + max, summed in double as on the host.
__device__ float LogSumExp(Row row, float max_logit, Shared& s) {
  double sum = 0.0;
  ForEachToken(row, [&](int32_t, float l) {
    sum +=
        static_cast<double>(static_cast<float>(exp(static_cast<double>(__fsub_rn(l, max_logit)))));
  });
  return static_cast<float>(static_cast<double>(max_logit) +
                            log(BlockSum<kThreads>(sum, s.warp_sums)));
}

// The `n` most likely tokens, ranked, into s.top_keys / s.top_ids.
__device__ void CollectTop(Row row, int32_t n, Shared& s) {
  const Boundary b = FindCrossing(row, CountOne{}, static_cast<uint64_t>(n - 1), s);
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  ForEachToken(row, [&](int32_t i, float l) {
    const uint32_t k = RankKey(l);
    if (!InPrefix(k, i, b)) return;
    const int slot = atomicAdd(&s.count, 1);
    if (slot < n) {
      s.top_keys[slot] = k;
      s.top_ids[slot] = i;
    }
  });
  __syncthreads();
  if (threadIdx.x == 0) {  // at most 20: insertion sort, most likely first, lower id on ties
    for (int i = 1; i < n; ++i) {
      const uint32_t k = s.top_keys[i];
      const int32_t id = s.top_ids[i];
      int j = i;
      for (; j > 0 && (s.top_keys[j - 1] < k || (s.top_keys[j - 1] == k && s.top_ids[j - 1] > id));
           --j) {
        s.top_keys[j] = s.top_keys[j - 1];
        s.top_ids[j] = s.top_ids[j - 1];
      }
      s.top_keys[j] = k;
      s.top_ids[j] = id;
    }
  }
  __syncthreads();
}

__device__ void WriteLogprobs(Row row, const RowSampling& rs, int32_t token, float max_logit,
                              Shared& s, SampledRow* out) {
  const float log_z = LogSumExp(row, max_logit, s);
  const int32_t n = min(min(rs.logprobs, kMaxSampledAlternatives), row.vocab);
  if (n > 0) CollectTop(row, n, s);
  if (threadIdx.x != 0) return;
  out->logprob = row.logits[token] - log_z;
  out->alternatives = max(n, 0);
  for (int i = 0; i < n; ++i) {
    out->alternative_tokens[i] = s.top_ids[i];
    out->alternative_logprobs[i] = row.logits[s.top_ids[i]] - log_z;
  }
}

// Both kernels here are dependent launches (dependent_launch.cuh): the last of a decode step's
// chain of small kernels.
__global__ void __launch_bounds__(kThreads) SampleRowsKernel(SampleRowsParams p) {
  AfterPriorGrids();
  __shared__ Shared s;
  const Row row{p.logits + blockIdx.x * p.stride, static_cast<int32_t>(p.vocab)};
  const RowSampling rs = p.sampling[blockIdx.x];
  SampledRow* out = p.out + blockIdx.x;
  RowStats stats = Stats(row, s);
  // A row of -inf alone has no token either (uniform across the block: every thread reads the
  // same best key).
  stats.finite = stats.finite && (row.vocab == 0 || isfinite(KeyLogit(stats.best_key)));
  if (threadIdx.x == 0) {
    out->token = 0;
    out->status = stats.finite ? RowSampleStatus::kOk : RowSampleStatus::kNonFinite;
    out->logprob = 0.0f;
    out->alternatives = 0;
    for (int i = 0; i < kMaxSampledAlternatives; ++i) {  // a row's bytes depend on it alone
      out->alternative_tokens[i] = 0;
      out->alternative_logprobs[i] = 0.0f;
    }
  }
  if (!stats.finite || row.vocab == 0) return;  // uniform across the block
  const float max_logit = KeyLogit(stats.best_key);
  const int32_t token = rs.temperature > 0.0f ? Draw(row, rs, max_logit, s) : stats.best_id;
  if (threadIdx.x == 0) out->token = token;
  if (rs.logprobs >= 0) WriteLogprobs(row, rs, token, max_logit, s, out);
}

__global__ void __launch_bounds__(kThreads) MaskLogitsKernel(MaskLogitsParams p) {
  AfterPriorGrids();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.vocab) return;
  const int64_t words = (p.vocab + 31) / 32;
  const uint32_t word = p.bits[blockIdx.y * words + t / 32];
  if ((word >> (t & 31)) & 1u) return;
  float* logit = p.logits + p.rows[blockIdx.y] * p.stride + t;
  if (*logit < INFINITY) *logit = -INFINITY;  // NaN and +inf stay for SampleRows to report
}

}  // namespace

cudaError_t MaskLogits(const MaskLogitsParams& p, cudaStream_t stream) {
  if (p.masked_rows == 0 || p.vocab == 0) return cudaSuccess;
  if (p.masked_rows > 65535 || p.vocab > INT_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.vocab + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.masked_rows));
  return LaunchDependent<MaskLogitsKernel>(grid, dim3(kThreads), 0, stream, p);
}

cudaError_t SampleRows(const SampleRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.vocab > (int64_t{1} << 24) || p.rows > INT_MAX) return cudaErrorInvalidValue;
  return LaunchDependent<SampleRowsKernel>(dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0,
                                           stream, p);
}

}  // namespace specula::kernels
