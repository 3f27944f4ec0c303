// The sparse KV cache's device operations (docs/SPARSE_KV.md, "The decode step on the device").
// Page scoring, top-k selection, residency bookkeeping and prefetch planning all run on the
// device, over state that lives there, so a decode step never waits for the host between layers:
// the host plans each step once (which rows, which positions) and reads back only the sampled
// tokens and a few counters.
//
// Everything here is plain data: pointers into backend memory and sizes, the same for the CPU
// backend (the reference) and the CUDA kernels. What the kernels read as is (the plan rows, the
// residency arrays, the copy entries, the enums and the slot layout) is kernels/sparse_abi.h,
// one definition for both.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backend/backend_types.h"
#include "engine/backend/device_span.h"
#include "kernels/sparse_abi.h"

namespace specula {

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

// Where a selection stages its copies: list (row, head) holds copy_count[row * kv_heads + head]
// entries from copies[(row * kv_heads + head) * copy_stride].
struct PageStaging {
  DeviceSpan<PageGatherEntry> copies;
  DeviceSpan<int32_t> copy_count;
  int32_t copy_stride = 0;
};

struct SparseSelectArgs {
  DeviceSpan<const SparseRowPlan> rows;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;
  SelectMode mode = SelectMode::kResolve;
  int32_t max_cache_slots = 0;     // the largest C of any row (sizes a GPU block's shared memory)
  bool stage_ranked = false;       // kResolve: cross_step speculation
  // kResolve, miss_policy defer: a late page (slot mapped, copy in flight) is attended from its
  // slot (the caller makes attention wait for the copy); a page with no slot is left out unless
  // it ranks among its row's best `correct_pages` (then read from the host store).
  // Otherwise (fetch) both are read from the host store.
  bool defer_missing = false;
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
