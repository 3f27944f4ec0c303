// The sparse KV cache's device operations (docs/SPARSE_KV.md, "The decode step on the device").
// Page scoring, top-k selection, residency bookkeeping and prefetch planning all run on the
// device, over state that lives there, so a decode step never waits for the host between layers:
// the host plans each step once (which rows, which positions) and reads back only the sampled
// tokens and a few counters.
//
// Everything here is plain data: pointers into backend memory and sizes, the same for the CPU
// backend (the reference) and the CUDA kernels (kernels/sparse.h mirrors the layouts; the CUDA
// backend static_asserts that they agree).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backend_types.h"
#include "engine/device_span.h"

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
inline constexpr uint32_t PredictStamp(uint32_t step) { return 2 * step; }
inline constexpr uint32_t UseStamp(uint32_t step) { return 2 * step + 1; }

// An entry of an attend list: a page of the device pool (>= 0), or page p of the host store
// read straight from host memory (HostPageRef(p) < 0): a selected page that is not resident
// under miss_policy fetch, exact at the price of reading host memory over the bus.
inline constexpr int32_t HostPageRef(int32_t page) { return -1 - page; }
inline constexpr bool IsHostPageRef(int32_t ref) { return ref < 0; }
inline constexpr int32_t HostPageOf(int32_t ref) { return -1 - ref; }

// One sparse sequence's state on the device. Slot i of (layer, KV head) is page
// blocks[i] * kv_heads + head of that layer's KV pool; slots [0, S) hold the sinks, [S, S+W+1)
// the recent window (a ring: page p in S + p % (W+1)), and the cache slots follow
// (cache slot j is slot S + W + 1 + j). Arrays indexed [layer][kv head][...] are flattened with
// lh = layer * kv_heads + head.
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
};

// Counters an operation adds to per (row, KV head), read back with the step's tokens.
enum SparseCounter : int32_t {
  kCounterHit = 0,      // selected pages resident with their copy landed
  kCounterLate = 1,     // selected pages whose staging copy was still in flight
  kCounterMissed = 2,   // selected pages not resident
  kCounterFetched = 3,  // pages read from the host store at use (fetch) or loaded at decode start
  kCounterStaged = 4,   // pages staged for a copy stream to load (prefetched bytes)
  kSparseCounterCount = 5,
};

// Scores every candidate page of each (row, KV head): the GQA group's query heads score the
// KV head's pages together, a page's score being the max over the group (page_selector notes
// in docs/SPARSE_KV.md). scores[score_begin + head * candidates + i] is page S + i's.
struct SparseScoreArgs {
  DeviceSpan<const SparseRowPlan> rows;
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t max_candidates = 0;  // the largest `candidates` of any row (sizes a GPU grid)
  int32_t q_first_row = 0;     // q holds rows from this one: row r's queries are q.row(r - it)
  PageScoring scoring = PageScoring::kQuest;
  const float* summaries = nullptr;  // quest: [host page][min | max][head_dim] fp32
  PagePoolView host_pool;            // exact: the keys, in the host store
  DeviceSpan<float> scores;
};

// One page a copy stream loads: page_bytes from src (host store) to dst (a cache slot), then
// *state = kSlotReady.
struct PageGatherEntry {
  const void* src = nullptr;
  void* dst = nullptr;
  int32_t* state = nullptr;
};

// Where a selection stages its copies: list (row, head) holds copy_count[row * kv_heads + head]
// entries from copies[(row * kv_heads + head) * copy_stride].
struct PageStaging {
  DeviceSpan<PageGatherEntry> copies;
  DeviceSpan<int32_t> copy_count;
  int32_t copy_stride = 0;
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

struct SparseSelectArgs {
  DeviceSpan<const SparseRowPlan> rows;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;
  SelectMode mode = SelectMode::kResolve;
  int32_t max_cache_slots = 0;     // the largest C of any row (sizes a GPU block's shared memory)
  bool stage_ranked = false;       // kResolve: cross_step speculation
  bool skip_missing = false;       // kResolve: miss_policy skip (leave non-resident pages out)
  bool urgent = false;             // kStage: the pages are for this step (cross_layer)
  DeviceSpan<const float> scores;  // ScorePages' output; unused when candidates <= B (all taken)
  PagePoolView device_pool;        // the layer's KV pool pages
  PagePoolView host_pool;          // the host store
  // kResolve: the attend lists (pages as HostPageRef or pool page ids, valid tokens each) and
  // their lengths, [rows * kv_heads].
  DeviceSpan<int32_t> list_pages;
  DeviceSpan<int32_t> list_tokens;
  DeviceSpan<int32_t> list_count;
  PageStaging staging;           // kResolve, kStage
  DeviceSpan<int64_t> counters;  // [rows][kv_heads][kSparseCounterCount], added to
};

// Loads staged pages on a copy stream (the prefetch), each then marked ready.
struct PageGatherArgs {
  DeviceSpan<const PageGatherEntry> copies;
  DeviceSpan<const int32_t> copy_count;
  int32_t lists = 0;
  int32_t copy_stride = 0;
  size_t page_bytes = 0;
  // Pinned host memory: the number of pages gathered, written once they have all landed (so the
  // host can tell an empty gather from one that moved pages without a readback).
  int32_t* pages_gathered = nullptr;
};

// Before a step's KV write: pages leaving the recent window move from their ring slot to a
// cache slot (one not used by the previous step), so they stay resident as candidates.
struct SparseRetireArgs {
  DeviceSpan<const SparseRowPlan> rows;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t max_cache_slots = 0;  // the largest C of any row
  PagePoolView device_pool;
};

// After a step's KV write: each page the new token completed is written back to the host store
// and, with quest, summarized (min and max of its keys per channel).
struct SparseCompleteArgs {
  DeviceSpan<const SparseRowPlan> rows;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  PagePoolView device_pool;
  PagePoolView host_pool;
  float* summaries = nullptr;  // null: no summaries (exact scoring)
};

// Summaries of full pages: page src[i] of `pool` summarizes into summaries[dst[i]] (prefill).
struct PageSummaryArgs {
  DeviceSpan<const int32_t> src;
  DeviceSpan<const int32_t> dst;
  PagePoolView pool;
  float* summaries = nullptr;
};

}  // namespace specula
