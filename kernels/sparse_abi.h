// The data the host and the device share for the sparse KV cache: a step's plan rows, a
// sequence's residency arrays, the copy list entries, the enums and the slot layout. One
// definition, included by the engine (engine/backend/sparse_ops.h), the CPU reference
// (engine/cpu/cpu_sparse_ops.cc) and the CUDA kernels (kernels/sparse.cu), so a plan the host
// writes is read by a kernel as is. Plain C++: the helpers are __host__ __device__ under nvcc and
// ordinary inline functions under g++. This header includes nothing of the engine's.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SPECULA_HOST_DEVICE __host__ __device__
#else
#define SPECULA_HOST_DEVICE
#endif

namespace specula {

enum class PageScoring : int32_t {
  kQuest = 0,  // per-page min/max bound of q·k from the summaries (the default)
  kExact = 1,  // true max q·k over the page's keys, read from the host store (the oracle)
};

// A cache slot's state. Only the copy stream that loads a slot moves it from loading to ready;
// everything else is done by operations on the compute stream.
enum SlotState : int32_t { kSlotFree = 0, kSlotLoading = 1, kSlotReady = 2 };

// Recency stamps, in half steps: a page staged for step t (a prediction) ranks below a page used
// at step t, so a real use outranks a guess for the same step.
SPECULA_HOST_DEVICE inline constexpr uint32_t PredictStamp(uint32_t step) { return 2 * step; }
SPECULA_HOST_DEVICE inline constexpr uint32_t UseStamp(uint32_t step) { return 2 * step + 1; }

// An entry of an attend list: a page of the device pool (>= 0), or page p of the host store
// read straight from host memory (HostPageRef(p) < 0): a selected page that is not resident
// under miss_policy fetch (or a corrected miss under defer), exact at the price of reading host
// memory over the bus.
SPECULA_HOST_DEVICE inline constexpr int32_t HostPageRef(int32_t page) { return -1 - page; }
SPECULA_HOST_DEVICE inline constexpr bool IsHostPageRef(int32_t ref) { return ref < 0; }
SPECULA_HOST_DEVICE inline constexpr int32_t HostPageOf(int32_t ref) { return -1 - ref; }

// Counters an operation adds to per (row, KV head), read back with the step's tokens.
enum SparseCounter : int32_t {
  kCounterHit = 0,        // selected pages resident with their copy landed
  kCounterLate = 1,       // selected pages whose staging copy was still in flight
  kCounterMissed = 2,     // selected pages not resident
  kCounterFetched = 3,    // pages read from the host store at use (fetch) or loaded at decode start
  kCounterStaged = 4,     // pages staged for a copy stream to load (prefetched bytes)
  kCounterCorrected = 5,  // missed pages read from the host store at once under defer (also
                          // counted missed and fetched)
  kSparseCounterCount = 6,
};

enum class SelectMode : int32_t {
  // This step's attention: take the top B pages, classify them (hit / late / missed), write the
  // attend list (sinks, selected in position order, window) and stage the missed pages (and,
  // with stage_ranked, those ranked B+1..C: cross_step) for the next step.
  kResolve = 0,
  // Stage the top C pages (cross_layer for this step; the prompt's last row for step 1).
  kStage = 1,
  // Copy every candidate into a cache slot now, on this stream, and mark it ready: decode start
  // when the budget covers every candidate.
  kLoadNow = 2,
};

// One sparse sequence's state on the device. Slot i of (layer, KV head) is page
// blocks[i] * kv_heads + head of that layer's KV pool; slots [0, S) hold the sinks, [S, S+W+1)
// the recent window (a ring: page p in S + p % (W+1)), and the cache slots follow
// (cache slot j is slot S + W + 1 + j): SparseHead computes these. Arrays indexed
// [layer][kv head][...] are flattened with lh = layer * kv_heads + head.
struct SparseSeqDevice {
  const int32_t* host_pages = nullptr;  // [lh][pages]: the host store page of each page
  int32_t* page_slot = nullptr;         // [lh][pages]: its cache slot, or -1
  int32_t* slot_page = nullptr;         // [lh][cache_slots]: the page a cache slot holds, or -1
  int32_t* slot_state = nullptr;        // [lh][cache_slots]: SlotState
  uint32_t* slot_stamp = nullptr;       // [lh][cache_slots]: recency (UseStamp/PredictStamp)
  const int32_t* blocks = nullptr;      // [slots_per_head]: KV-pool block of each slot
  int32_t pages = 0;                    // pages per (layer, KV head)
  int32_t sink_pages = 0;               // S
  int32_t window_pages = 0;             // W
  int32_t budget_pages = 0;             // B: selected per (layer, KV head) and step
  int32_t cache_slots = 0;              // C >= B
};

// One sparse sequence's row in a step's plan.
struct SparseRowPlan {
  SparseSeqDevice seq;
  int32_t q_row = 0;         // its row in q and out
  int32_t pos = 0;           // position of the token this step adds (decode) or will add (staging
                             // at the end of prefill: the first decode token's)
  uint32_t step = 0;         // the sequence's decode step: 1 for the first; 0 at prefill's end
  int32_t retire_begin = 0;  // pages [retire_begin, retire_end) left the window at this step
  int32_t retire_end = 0;
  int32_t completes_page = 0;  // 1 when this step's token fills its page
  int32_t candidates = 0;     // selectable pages: [S, S + candidates), full pages before the window
  int32_t score_begin = 0;    // scores of (row, head) at score_begin + head * candidates
  int32_t list_begin = 0;     // attend list of (row, head) at list_begin + head * list_capacity
  int32_t list_capacity = 0;  // S + B + W + 1
  // miss_policy defer: a missed page among the best `correct_pages` of the selection is read
  // from the host store at once (a correction); the other misses wait for the next step. Every
  // miss is corrected when the budget covers every candidate (no ranking to go by).
  int32_t correct_pages = 0;
};

// One page a copy stream loads: page_bytes from src (host store) to dst (a cache slot), then
// *state = kSlotReady.
struct PageGatherEntry {
  const void* src = nullptr;
  void* dst = nullptr;
  int32_t* state = nullptr;
};

// The arrays and slot layout of one (row, layer, KV head) of a sparse sequence; the CPU
// reference and the kernels build their per-head work on it.
struct SparseHead {
  SPECULA_HOST_DEVICE SparseHead(const SparseRowPlan& row, int32_t layer, int32_t head,
                                 int32_t kv_heads)
      : seq(row.seq), head(head), kv_heads(kv_heads) {
    const int64_t lh = static_cast<int64_t>(layer) * kv_heads + head;
    host_pages = seq.host_pages + lh * seq.pages;
    page_slot = seq.page_slot + lh * seq.pages;
    slot_page = seq.slot_page + lh * seq.cache_slots;
    state = seq.slot_state + lh * seq.cache_slots;
    stamp = seq.slot_stamp + lh * seq.cache_slots;
  }
  // The KV-pool page (in the layer's page pool) of slot `slot` (sink, ring or cache).
  SPECULA_HOST_DEVICE int64_t PoolPage(int32_t slot) const {
    return static_cast<int64_t>(seq.blocks[slot]) * kv_heads + head;
  }
  // Cache slot j's slot.
  SPECULA_HOST_DEVICE int32_t CacheSlot(int32_t j) const {
    return seq.sink_pages + seq.window_pages + 1 + j;
  }
  // The ring slot of window page `page`.
  SPECULA_HOST_DEVICE int32_t RingSlot(int32_t page) const {
    return seq.sink_pages + page % (seq.window_pages + 1);
  }
  // Where page `page`'s new tokens are written: its sink slot, else its ring slot.
  SPECULA_HOST_DEVICE int32_t WriteSlot(int32_t page) const {
    return page < seq.sink_pages ? page : RingSlot(page);
  }

  const SparseSeqDevice& seq;
  int32_t head;
  int32_t kv_heads;
  const int32_t* host_pages;
  int32_t* page_slot;
  int32_t* slot_page;
  int32_t* state;  // slot_state
  uint32_t* stamp;
};

}  // namespace specula
