// The sparse KV cache's device operations. Semantics and tie rules are the CPU reference's
// (engine/cpu/cpu_sparse_ops.cc); the tests compare the two.
#include <algorithm>
#include <cstdint>
#include <cuda/atomic>

#include "kernels/device_math.cuh"
#include "kernels/sparse.h"

namespace specula::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ int32_t LoadState(int32_t* state) {
  return cuda::atomic_ref<int32_t, cuda::thread_scope_device>(*state).load(
      cuda::memory_order_acquire);
}
__device__ __forceinline__ void StoreState(int32_t* state, int32_t value) {
  cuda::atomic_ref<int32_t, cuda::thread_scope_device>(*state).store(value,
                                                                     cuda::memory_order_release);
}

// One (row, layer, KV head) of a sparse sequence (its arrays and slot layout).
using Head = SparseHead;

__device__ __forceinline__ char* PageAt(const Pool& pool, int64_t page) {
  return static_cast<char*>(pool.base) + page * pool.page_bytes;
}

// Copies one page with the whole block, 16 bytes a thread at a time (the launchers refuse page
// sizes that are not a multiple of 16 bytes).
__device__ void CopyPage(void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<int4*>(dst);
  const auto* s = static_cast<const int4*>(src);
  for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
}

// A total order of (score, index), larger is better: higher score, NaN below every number, then
// the lower index. Unique per index, so the k-th largest key splits the set exactly.
__device__ __forceinline__ uint64_t RankKey(float score, int32_t index) {
  uint32_t bits = __float_as_uint(score == 0.0f ? 0.0f : score);  // -0 ranks as +0, as on the CPU
  if (isnan(score)) {
    bits = 0;
  } else {
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

// The k-th largest RankKey of scores[0, n) (1 <= k <= n), by radix selection, 8 bits at a time
// from the top. Every thread of the block calls it and gets the result.
__device__ uint64_t KthLargestKey(const float* scores, int32_t n, int32_t k) {
  __shared__ int32_t hist[256];
  __shared__ uint64_t prefix_shared;
  __shared__ int32_t remaining_shared;
  if (threadIdx.x == 0) {
    prefix_shared = 0;
    remaining_shared = k;
  }
  uint64_t mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint64_t prefix = prefix_shared;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t key = RankKey(scores[i], i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int32_t remaining = remaining_shared;
      int b = 255;
      for (; b > 0 && hist[b] < remaining; --b) remaining -= hist[b];
      remaining_shared = remaining;
      prefix_shared = prefix | (static_cast<uint64_t>(b) << shift);
    }
    mask |= static_cast<uint64_t>(255) << shift;
    __syncthreads();
  }
  return prefix_shared;
}

// Writes, in index order, the indices i < n with in(i) true to out; returns how many (every
// thread of the block gets it).
template <typename Pred>
__device__ int32_t Compact(int32_t n, Pred in, int32_t* out) {
  __shared__ int32_t warp_counts[kWarpsPerBlock];
  __shared__ int32_t base_shared;
  if (threadIdx.x == 0) base_shared = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int32_t chunk = 0; chunk < n; chunk += blockDim.x) {
    const int32_t i = chunk + threadIdx.x;
    const bool keep = i < n && in(i);
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int32_t before = base_shared;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (keep) out[before + __popc(ballot & ((1u << lane) - 1))] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarpsPerBlock; ++w) base_shared += warp_counts[w];
    }
    __syncthreads();
  }
  return base_shared;
}

// Sorts items[0, m) by keys descending (keys unique), using `scratch` (m ints); whole block.
__device__ void SortByKeyDescending(int32_t m, const uint64_t* keys, int32_t* items,
                                    int32_t* scratch) {
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) {
    int32_t rank = 0;
    for (int32_t u = 0; u < m; ++u) rank += keys[u] > keys[t];
    scratch[rank] = items[t];
  }
  __syncthreads();
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) items[t] = scratch[t];
  __syncthreads();
}

// Sorts distinct items[0, m) ascending, using `scratch` (m ints); whole block.
__device__ void SortAscending(int32_t m, int32_t* items, int32_t* scratch) {
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) {
    int32_t rank = 0;
    for (int32_t u = 0; u < m; ++u) rank += items[u] < items[t];
    scratch[rank] = items[t];
  }
  __syncthreads();
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) items[t] = scratch[t];
  __syncthreads();
}

// The cache slots of one (row, head), copied to shared memory for the block's claims: a slot
// seen loading is never claimed (its copy may land meanwhile: that only makes it ready), and
// only this block claims slots of its (row, head).
struct Slots {
  int32_t* page;   // slot_page
  int32_t* state;  // SlotState as seen
  uint32_t* stamp;
  int32_t* claimed;  // 1 when this block claimed it (its state must be written back)
  int32_t count;
};

// Picks a slot for a claim, with one warp: free first (lowest index), else the least recently
// stamped ready slot stamped before `evict_before` (lowest index on ties). -1 when none; every
// lane gets the answer.
__device__ int32_t PickVictim(const Slots& s, uint32_t evict_before) {
  const int lane = threadIdx.x % 32;
  uint64_t best = ~0ull;
  for (int32_t j = lane; j < s.count; j += 32) {
    uint64_t key = ~0ull;
    if (s.state[j] == kSlotFree) {
      key = static_cast<uint64_t>(j);
    } else if (s.state[j] == kSlotReady && s.stamp[j] < evict_before) {
      key = (1ull << 62) | (static_cast<uint64_t>(s.stamp[j]) << 24) | static_cast<uint64_t>(j);
    }
    best = min(best, key);
  }
  best = WarpMin(best);
  return best == ~0ull ? -1 : static_cast<int32_t>(best & 0xFFFFFF);
}

// Claims a slot for `page` with warp 0 (lane 0 writes): maps the page to it, loading.
__device__ int32_t Claim(Slots& s, const Head& h, int32_t page, uint32_t evict_before,
                         uint32_t new_stamp) {
  const int32_t v = PickVictim(s, evict_before);
  if (v >= 0 && threadIdx.x == 0) {
    if (s.page[v] >= 0) h.page_slot[s.page[v]] = -1;
    s.page[v] = page;
    h.page_slot[page] = v;
    s.stamp[v] = new_stamp;
    s.state[v] = kSlotLoading;
    s.claimed[v] = 1;
  }
  __syncwarp();
  return v;
}

// The per-block state of SelectKernel, in dynamic shared memory: slots, the selection and the
// pages to stage, each `c` entries (the most cache slots of any row).
struct SelectShared {
  __device__ SelectShared(char* memory, int32_t c) {
    auto* words = reinterpret_cast<int32_t*>(memory);
    keys = reinterpret_cast<uint64_t*>(memory);  // c keys first (8-byte aligned)
    words += 2 * c;
    slots.page = words;
    slots.state = words + c;
    slots.stamp = reinterpret_cast<uint32_t*>(words + 2 * c);
    slots.claimed = words + 3 * c;
    selected = words + 4 * c;
    outcome = words + 5 * c;
    wanted = words + 6 * c;
    scratch = words + 7 * c;
    slots.count = 0;
  }
  static size_t Bytes(int32_t c) { return static_cast<size_t>(c) * (8 + 8 * 4); }
  uint64_t* keys;
  Slots slots;
  int32_t* selected;  // page indices
  int32_t* outcome;   // per selected: kCounterHit, kCounterLate, kCounterMissed or (a miss
                      // defer corrects) kCounterCorrected
  int32_t* wanted;    // pages to stage, in order
  int32_t* scratch;
};

__device__ void LoadSlots(const Head& h, Slots* s) {
  for (int32_t j = threadIdx.x; j < h.seq.cache_slots; j += blockDim.x) {
    s->page[j] = h.slot_page[j];
    s->state[j] = LoadState(&h.state[j]);
    s->stamp[j] = h.stamp[j];
    s->claimed[j] = 0;
  }
  s->count = h.seq.cache_slots;  // every thread's copy of the view
  __syncthreads();
}

// Writes the block's claims and stamps back (a state only where this block claimed the slot: a
// copy stream may be marking other slots ready meanwhile).
__device__ void StoreSlots(const Head& h, const Slots& s) {
  __syncthreads();
  for (int32_t j = threadIdx.x; j < s.count; j += blockDim.x) {
    h.stamp[j] = s.stamp[j];
    if (!s.claimed[j]) continue;
    h.slot_page[j] = s.page[j];
    StoreState(&h.state[j], s.state[j]);
  }
}

// Ranked candidates: pages S + i for the best `k` (k <= n) in rank order into `out`; when the
// budget covers every candidate (no scores), all of them in position order. Returns the count.
__device__ int32_t RankCandidates(const SparseRowPlan& row, const float* scores, int32_t k,
                                  SelectShared& sh, int32_t* out) {
  const int32_t n = row.candidates, first = row.seq.sink_pages;
  if (n <= row.seq.budget_pages) {
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = first + i;
    __syncthreads();
    return n;
  }
  k = min(k, n);
  const uint64_t threshold = KthLargestKey(scores, n, k);
  const int32_t m = Compact(
      n, [&](int32_t i) { return RankKey(scores[i], i) >= threshold; }, out);
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x)
    sh.keys[t] = RankKey(scores[out[t]], out[t]);
  __syncthreads();
  SortByKeyDescending(m, sh.keys, out, sh.scratch);
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) out[t] += first;
  __syncthreads();
  return m;
}

// Stages `page` (warp 0): touched if mapped, else a claimed slot and a copy entry. False when no
// slot could be had.
__device__ bool Stage(Slots& s, const Head& h, const SelectParams& p, int32_t page,
                      uint32_t evict_before, uint32_t new_stamp, PageGatherEntry* entries,
                      int32_t* count, int64_t* counters) {
  const int32_t mapped = h.page_slot[page];
  __syncwarp();
  if (mapped >= 0) {
    if (threadIdx.x == 0) s.stamp[mapped] = max(s.stamp[mapped], new_stamp);
    __syncwarp();
    return true;
  }
  const int32_t v = Claim(s, h, page, evict_before, new_stamp);
  if (v < 0) return false;
  if (threadIdx.x == 0) {
    entries[(*count)++] =
        PageGatherEntry{PageAt(p.host, h.host_pages[page]),
                        PageAt(p.device, h.PoolPage(h.CacheSlot(v))), &h.state[v]};
    ++counters[kCounterStaged];
  }
  __syncwarp();
  return true;
}

// One block's (row, KV head) list of a SelectPages operation.
struct SelectBlock {
  const SelectParams& p;
  const SparseRowPlan& row;
  const Head& h;
  SelectShared& sh;
  int64_t* counters;         // this list's
  const float* scores;       // this list's, or null (all candidates taken)
  PageGatherEntry* entries;  // this list's staged copies, or null
  int32_t* staged;           // shared: how many

  // Stages `page` (warp 0) with this list's buffers.
  __device__ bool StagePage(int32_t page, uint32_t evict_before, uint32_t new_stamp) const {
    return Stage(sh.slots, h, p, page, evict_before, new_stamp, entries, staged, counters);
  }
  // Publishes the staging count and the slots (every thread).
  __device__ void Finish() const {
    __syncthreads();
    if (threadIdx.x == 0) p.copy_count[blockIdx.x] = *staged;
    StoreSlots(h, sh.slots);
  }
};

// kLoadNow: every candidate not resident is copied into a cache slot now (by the whole block)
// and marked ready.
__device__ void LoadNow(const SelectBlock& b) {
  const int32_t S = b.row.seq.sink_pages;
  __shared__ int32_t loaded;
  if (threadIdx.x < 32) {
    int32_t n = 0;
    for (int32_t page = S; page < S + b.row.candidates; ++page) {
      if (b.h.page_slot[page] >= 0) continue;
      const uint32_t stamp = PredictStamp(b.row.step + 1);
      const int32_t v = Claim(b.sh.slots, b.h, page, stamp, stamp);
      if (v < 0) break;
      if (threadIdx.x == 0) {
        b.sh.wanted[n] = page;
        b.sh.selected[n] = v;
      }
      ++n;
    }
    if (threadIdx.x == 0) loaded = n;
  }
  __syncthreads();
  for (int32_t i = 0; i < loaded; ++i) {
    CopyPage(PageAt(b.p.device, b.h.PoolPage(b.h.CacheSlot(b.sh.selected[i]))),
             PageAt(b.p.host, b.h.host_pages[b.sh.wanted[i]]), b.p.host.page_bytes);
  }
  __threadfence();
  __syncthreads();
  for (int32_t i = threadIdx.x; i < loaded; i += blockDim.x)
    b.sh.slots.state[b.sh.selected[i]] = kSlotReady;
  if (threadIdx.x == 0) b.counters[kCounterFetched] += loaded;
  StoreSlots(b.h, b.sh.slots);
}

// kStage: the top C candidates are staged, for this step (urgent: cross_layer) or the next.
__device__ void StageTop(const SelectBlock& b) {
  const uint32_t stamp = b.p.urgent ? UseStamp(b.row.step) : PredictStamp(b.row.step + 1);
  const int32_t m = RankCandidates(b.row, b.scores, b.row.seq.cache_slots, b.sh, b.sh.wanted);
  for (int32_t t = threadIdx.x; t < m; t += blockDim.x) {
    const int32_t j = b.h.page_slot[b.sh.wanted[t]];
    if (j >= 0) b.sh.slots.stamp[j] = max(b.sh.slots.stamp[j], stamp);  // distinct slots
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    for (int32_t t = 0; t < m; ++t) {
      if (!b.StagePage(b.sh.wanted[t], stamp, stamp)) break;
    }
  }
  b.Finish();
}

// kResolve, thread 0: the attend list (sinks, the selected pages in position order, the window)
// and the counters, from the outcomes; the misses go to sh.scratch in position order. Returns
// how many missed.
__device__ int32_t WriteAttendList(const SelectBlock& b, int32_t selected) {
  const SparseRowPlan& row = b.row;
  const int32_t S = row.seq.sink_pages, ps = b.p.geometry.page_size;
  const int32_t current = row.pos / ps;
  const int64_t at = row.list_begin + static_cast<int64_t>(b.h.head) * row.list_capacity;
  int32_t n = 0;
  auto add = [&](int64_t ref, int32_t page) {
    b.p.list_pages[at + n] = static_cast<int32_t>(ref);
    b.p.list_tokens[at + n] = page == current ? row.pos % ps + 1 : ps;
    ++n;
  };
  for (int32_t page = 0; page < min(S, current + 1); ++page) add(b.h.PoolPage(page), page);
  int32_t hits = 0, late = 0, missed = 0, fetched = 0, corrected = 0;
  for (int32_t t = 0; t < selected; ++t) {
    const int32_t page = b.sh.selected[t];
    const int32_t outcome = b.sh.outcome[t];
    if (outcome == kCounterHit) {
      ++hits;
      add(b.h.PoolPage(b.h.CacheSlot(b.h.page_slot[page])), page);
      continue;
    }
    const bool is_late = outcome == kCounterLate;
    if (is_late) {
      ++late;
    } else {
      b.sh.scratch[missed++] = page;
    }
    if (b.p.defer_missing) {
      // Late: its slot, once the copy has landed (the caller waits). Missing: left out for
      // this step, unless it ranks high enough to be corrected (read from the host now).
      if (is_late) {
        add(b.h.PoolPage(b.h.CacheSlot(b.h.page_slot[page])), page);
        continue;
      }
      if (outcome != kCounterCorrected) continue;
      ++corrected;
    }
    ++fetched;
    add(HostPageRef(b.h.host_pages[page]), page);
  }
  for (int32_t page = S + row.candidates; page <= current; ++page) {
    add(b.h.PoolPage(b.h.RingSlot(page)), page);
  }
  b.p.list_count[blockIdx.x] = n;
  b.counters[kCounterHit] += hits;
  b.counters[kCounterLate] += late;
  b.counters[kCounterMissed] += missed;
  b.counters[kCounterFetched] += fetched;
  b.counters[kCounterCorrected] += corrected;
  return missed;
}

// Whether defer corrects a miss of `page`: every miss when the budget covers every candidate
// (nothing was ranked), else those among the best `correct_pages` (ranked[0, correct_pages), in
// rank order: RankCandidates').
__device__ bool Corrects(const SparseRowPlan& row, const int32_t* ranked, int32_t page) {
  if (row.correct_pages == 0) return false;
  if (row.candidates <= row.seq.budget_pages) return true;
  const int32_t k = min(row.correct_pages, row.seq.budget_pages);
  for (int32_t i = 0; i < k; ++i) {
    if (ranked[i] == page) return true;
  }
  return false;
}

// kResolve: this step's pages (the top B), their attend list, and for the next step the misses
// and (stage_ranked: cross_step) the pages ranked just below the cut.
__device__ void Resolve(const SelectBlock& b) {
  const uint32_t use = UseStamp(b.row.step), next = PredictStamp(b.row.step + 1);
  const int32_t B = b.row.seq.budget_pages;
  const int32_t ranked = RankCandidates(
      b.row, b.scores, b.p.stage_ranked ? b.row.seq.cache_slots : B, b.sh, b.sh.wanted);
  const int32_t selected = min(ranked, B);
  // The selection in position order (the first `selected` ranked), the rest stay in sh.wanted.
  for (int32_t t = threadIdx.x; t < selected; t += blockDim.x) b.sh.selected[t] = b.sh.wanted[t];
  __syncthreads();
  SortAscending(selected, b.sh.selected, b.sh.scratch);
  for (int32_t t = threadIdx.x; t < selected; t += blockDim.x) {
    const int32_t page = b.sh.selected[t];
    const int32_t j = b.h.page_slot[page];
    if (j >= 0) {
      b.sh.slots.stamp[j] = max(b.sh.slots.stamp[j], use);  // staging below cannot evict it
      b.sh.outcome[t] = b.sh.slots.state[j] == kSlotReady ? kCounterHit : kCounterLate;
    } else {
      b.sh.outcome[t] = b.p.defer_missing && Corrects(b.row, b.sh.wanted, page) ? kCounterCorrected
                                                                             : kCounterMissed;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) b.sh.outcome[0] = WriteAttendList(b, selected);  // the count, for warp 0
  __syncthreads();
  const int32_t missed = b.sh.outcome[0];
  if (threadIdx.x < 32) {
    bool room = true;
    for (int32_t t = 0; room && t < missed; ++t) room = b.StagePage(b.sh.scratch[t], use, next);
    for (int32_t t = selected; room && t < ranked; ++t) {
      room = b.StagePage(b.sh.wanted[t], use, next);
    }
  }
  b.Finish();
}

// grid rows * kv_heads, kThreads threads, SelectShared::Bytes(max cache slots) dynamic shared.
__global__ void __launch_bounds__(kThreads) SelectKernel(SelectParams p) {
  extern __shared__ __align__(16) char shared_memory[];
  const int32_t head = blockIdx.x % p.num_kv_heads;
  const SparseRowPlan& row = p.rows[blockIdx.x / p.num_kv_heads];
  const Head h(row, p.layer, head, p.num_kv_heads);
  const int32_t C = row.seq.cache_slots;
  if (C > p.max_cache_slots) __trap();  // the shared memory was sized for fewer slots
  SelectShared sh(shared_memory, max(C, 1));
  LoadSlots(h, &sh.slots);
  __shared__ int32_t staged;
  if (threadIdx.x == 0) staged = 0;
  const SelectBlock block{
      p,
      row,
      h,
      sh,
      p.counters + static_cast<int64_t>(blockIdx.x) * kSparseCounterCount,
      p.scores == nullptr
          ? nullptr
          : p.scores + row.score_begin + static_cast<int64_t>(head) * row.candidates,
      p.copies == nullptr ? nullptr : p.copies + static_cast<int64_t>(blockIdx.x) * p.copy_stride,
      &staged};
  switch (p.mode) {
    case SelectMode::kLoadNow:
      LoadNow(block);
      break;
    case SelectMode::kStage:
      StageTop(block);
      break;
    case SelectMode::kResolve:
      Resolve(block);
      break;
  }
}

// grid (rows * kv_heads, page chunks), kThreads threads: a warp per candidate page.
__global__ void __launch_bounds__(kThreads) ScoreKernel(ScoreParams p) {
  const int32_t row_index = blockIdx.x / p.num_kv_heads;
  const int32_t head = blockIdx.x % p.num_kv_heads;
  const SparseRowPlan& row = p.rows[row_index];
  if (row.candidates <= row.seq.budget_pages) return;  // all taken: nothing to rank
  const Head h(row, p.layer, head, p.num_kv_heads);
  const int32_t hd = p.geometry.head_dim;
  const int32_t group = p.num_heads / p.num_kv_heads;
  const float* queries = p.q + static_cast<int64_t>(row.q_row - p.q_first_row) * p.q_stride +
                         static_cast<int64_t>(head) * group * hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* out = p.scores + row.score_begin + static_cast<int64_t>(head) * row.candidates;
  for (int32_t i = blockIdx.y * kWarpsPerBlock + warp; i < row.candidates;
       i += gridDim.y * kWarpsPerBlock) {
    const int32_t page = h.host_pages[row.seq.sink_pages + i];
    float best = -INFINITY;
    if (!p.exact) {
      const float* mn = p.summaries + static_cast<int64_t>(page) * 2 * hd;
      const float* mx = mn + hd;
      for (int32_t g = 0; g < group; ++g) {
        float bound = 0.0f;
        for (int32_t c = lane; c < hd; c += 32) {
          const float q = queries[g * hd + c];
          bound += fmaxf(q * mn[c], q * mx[c]);
        }
        best = fmaxf(best, WarpSum(bound));
      }
    } else {
      const char* keys = static_cast<const char*>(p.host.base) + page * p.host.page_bytes;
      VisitStorageTypeOnDevice(p.geometry.dtype, [&](auto tag) {
        using T = decltype(tag);
        const auto* k = reinterpret_cast<const T*>(keys);
        for (int32_t t = 0; t < p.geometry.page_size; ++t) {
          for (int32_t g = 0; g < group; ++g) {
            float dot = 0.0f;
            for (int32_t c = lane; c < hd; c += 32) {
              dot += queries[g * hd + c] * ToFloat(k[t * hd + c]);
            }
            best = fmaxf(best, WarpSum(dot));
          }
        }
      });
    }
    if (lane == 0) out[i] = best;
  }
}

// grid (lists, copy_stride), kThreads threads: a block per staged page.
__global__ void __launch_bounds__(kThreads) GatherKernel(GatherParams p) {
  const int32_t list = blockIdx.x, e = blockIdx.y;
  if (e >= p.copy_count[list]) return;
  const PageGatherEntry& c = p.copies[static_cast<int64_t>(list) * p.copy_stride + e];
  CopyPage(c.dst, c.src, p.page_bytes);
  __threadfence();  // the page, before its ready flag
  __syncthreads();
  if (threadIdx.x == 0) StoreState(c.state, kSlotReady);
}

// One thread: the pages a gather moved, to mapped host memory.
__global__ void CountGatheredKernel(GatherParams p) {
  int32_t total = 0;
  for (int32_t list = 0; list < p.lists; ++list) total += p.copy_count[list];
  *p.pages_gathered = total;
}

// grid rows * kv_heads, kThreads threads.
__global__ void __launch_bounds__(kThreads) RetireKernel(RetireParams p) {
  extern __shared__ __align__(16) char shared_memory[];
  const SparseRowPlan& row = p.rows[blockIdx.x / p.num_kv_heads];
  if (row.retire_begin >= row.retire_end) return;
  const Head h(row, p.layer, blockIdx.x % p.num_kv_heads, p.num_kv_heads);
  if (row.seq.cache_slots > p.max_cache_slots) __trap();
  SelectShared sh(shared_memory, max(row.seq.cache_slots, 1));
  LoadSlots(h, &sh.slots);
  // Never evict a page the previous step used or one staged for this step.
  const uint32_t previous = UseStamp(row.step - 1);
  __shared__ int32_t claimed;
  for (int32_t page = row.retire_begin; page < row.retire_end; ++page) {
    if (threadIdx.x < 32) {
      const int32_t v = h.page_slot[page] >= 0 ? -1 : Claim(sh.slots, h, page, previous, previous);
      if (threadIdx.x == 0) claimed = v;
    }
    __syncthreads();
    const int32_t victim = claimed;
    __syncthreads();  // every thread has read it before warp 0 claims for the next page
    if (victim < 0) continue;
    CopyPage(PageAt(p.device, h.PoolPage(h.CacheSlot(victim))),
             PageAt(p.device, h.PoolPage(h.RingSlot(page))), p.device.page_bytes);
    if (threadIdx.x == 0) sh.slots.state[victim] = kSlotReady;
  }
  StoreSlots(h, sh.slots);
}

// Per-channel min and max of a page's keys (threads over channels).
template <typename T>
__device__ void Summarize(const T* keys, int32_t tokens, int32_t hd, float* summary) {
  for (int32_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float mn = ToFloat(keys[c]), mx = mn;
    for (int32_t t = 1; t < tokens; ++t) {
      const float x = ToFloat(keys[static_cast<int64_t>(t) * hd + c]);
      mn = fminf(mn, x);
      mx = fmaxf(mx, x);
    }
    summary[c] = mn;
    summary[hd + c] = mx;
  }
}

// grid rows * kv_heads, kThreads threads.
__global__ void __launch_bounds__(kThreads) CompleteKernel(CompleteParams p) {
  const SparseRowPlan& row = p.rows[blockIdx.x / p.num_kv_heads];
  if (!row.completes_page) return;
  const Head h(row, p.layer, blockIdx.x % p.num_kv_heads, p.num_kv_heads);
  const int32_t page = row.pos / p.geometry.page_size;
  const int32_t host_page = h.host_pages[page];
  const char* src = PageAt(p.device, h.PoolPage(h.WriteSlot(page)));
  CopyPage(PageAt(p.host, host_page), src, p.host.page_bytes);
  if (p.summaries == nullptr) return;
  VisitStorageTypeOnDevice(p.geometry.dtype, [&](auto tag) {
    Summarize(reinterpret_cast<const decltype(tag)*>(src), p.geometry.page_size,
              p.geometry.head_dim,
              p.summaries + static_cast<int64_t>(host_page) * 2 * p.geometry.head_dim);
  });
}

// grid count, 128 threads.
__global__ void SummarizeKernel(SummaryParams p) {
  const char* page = PageAt(p.pool, p.src[blockIdx.x]);
  VisitStorageTypeOnDevice(p.geometry.dtype, [&](auto tag) {
    Summarize(reinterpret_cast<const decltype(tag)*>(page), p.geometry.page_size,
              p.geometry.head_dim,
              p.summaries + static_cast<int64_t>(p.dst[blockIdx.x]) * 2 * p.geometry.head_dim);
  });
}

// Raises `kernel`'s dynamic shared memory limit to `bytes` when its static shared memory plus
// `bytes` pass the default 48 KiB; cudaErrorInvalidValue when the device cannot give that much
// (MaxSelectCacheSlots tells the engine the limit in advance).
template <typename Kernel>
cudaError_t PrepareShared(Kernel kernel, size_t bytes) {
  cudaFuncAttributes attributes;
  if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  if (attributes.sharedSizeBytes + bytes <= 48 * 1024) return cudaSuccess;
  if (bytes > static_cast<size_t>(attributes.maxDynamicSharedSizeBytes)) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(bytes));
  }
  return cudaSuccess;
}

}  // namespace

int32_t MaxSelectCacheSlots() {
  int device = 0, opt_in = 0;
  cudaFuncAttributes attributes;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&opt_in, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaFuncGetAttributes(&attributes, SelectKernel) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const size_t available = static_cast<size_t>(opt_in) - attributes.sharedSizeBytes;
  return static_cast<int32_t>(available / SelectShared::Bytes(1));
}

cudaError_t ScorePages(const ScoreParams& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.max_candidates == 0) return cudaSuccess;
  const auto chunks =
      static_cast<unsigned>(std::min<int64_t>(CeilDiv(p.max_candidates, kWarpsPerBlock), 1024));
  ScoreKernel<<<dim3(static_cast<unsigned>(p.num_rows * p.num_kv_heads), chunks), kThreads, 0,
                stream>>>(p);
  return LaunchStatus();
}

cudaError_t SelectPages(const SelectParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.host.page_bytes % 16 != 0)
    return cudaErrorInvalidValue;  // CopyPage moves 16 bytes a thread
  const size_t shared = SelectShared::Bytes(std::max(p.max_cache_slots, 1));
  if (const cudaError_t e = PrepareShared(SelectKernel, shared); e != cudaSuccess) return e;
  SelectKernel<<<static_cast<unsigned>(p.num_rows * p.num_kv_heads), kThreads, shared, stream>>>(p);
  return LaunchStatus();
}

cudaError_t GatherPages(const GatherParams& p, cudaStream_t stream) {
  if (p.page_bytes % 16 != 0 || p.copy_stride > 65535) return cudaErrorInvalidValue;
  if (p.lists > 0 && p.copy_stride > 0) {
    GatherKernel<<<dim3(static_cast<unsigned>(p.lists), static_cast<unsigned>(p.copy_stride)),
                   kThreads, 0, stream>>>(p);
  }
  if (p.pages_gathered != nullptr) CountGatheredKernel<<<1, 1, 0, stream>>>(p);
  return LaunchStatus();
}

cudaError_t RetireWindowPages(const RetireParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.device.page_bytes % 16 != 0) return cudaErrorInvalidValue;
  const size_t shared = SelectShared::Bytes(std::max(p.max_cache_slots, 1));
  if (const cudaError_t e = PrepareShared(RetireKernel, shared); e != cudaSuccess) return e;
  RetireKernel<<<static_cast<unsigned>(p.num_rows * p.num_kv_heads), kThreads, shared, stream>>>(p);
  return LaunchStatus();
}

cudaError_t CompletePages(const CompleteParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.host.page_bytes % 16 != 0) return cudaErrorInvalidValue;
  CompleteKernel<<<static_cast<unsigned>(p.num_rows * p.num_kv_heads), kThreads, 0, stream>>>(p);
  return LaunchStatus();
}

cudaError_t SummarizePages(const SummaryParams& p, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  SummarizeKernel<<<static_cast<unsigned>(p.count), 128, 0, stream>>>(p);
  return LaunchStatus();
}

}  // namespace specula::kernels
