// The sparse KV cache's device operations (semantics: engine/sparse_ops.h; reference:
// engine/cpu/cpu_sparse_ops.cc): page scoring, top-k selection with residency bookkeeping and
// staging, the copy stream's page gather, window retirement, page completion and summaries.
//
// The structs below mirror the engine's (SparseSeqDevice, SparseRowPlan, PageGatherEntry) field
// for field, so a plan written by the host is read here as is; engine/cuda/cuda_backend.cc
// static_asserts that the layouts agree. Pointers are device memory, or pinned host memory
// read through its mapping (the host store).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"

namespace specula::kernels {

struct SeqState {
  const int32_t* host_pages;
  int32_t* page_slot;
  int32_t* slot_page;
  int32_t* slot_state;
  uint32_t* slot_stamp;
  const int32_t* blocks;
  int32_t pages;
  int32_t sink_pages;
  int32_t window_pages;
  int32_t budget_pages;
  int32_t cache_slots;
};

struct RowPlan {
  SeqState seq;
  int32_t q_row;
  int32_t pos;
  uint32_t step;
  int32_t retire_begin;
  int32_t retire_end;
  int32_t completes_page;
  int32_t candidates;
  int32_t score_begin;
  int32_t list_begin;
  int32_t list_capacity;
};

struct GatherEntry {
  const void* src;
  void* dst;
  int32_t* state;
};

// Page pools: page p at base + p * page_bytes.
struct Pool {
  void* base = nullptr;
  int64_t page_bytes = 0;
};

struct PageGeometry {
  int32_t page_size = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
};

struct ScoreParams {
  const RowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t max_candidates = 0;
  int32_t q_first_row = 0;
  bool exact = false;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* summaries = nullptr;
  Pool host;
  PageGeometry geometry;
  float* scores = nullptr;
};
cudaError_t ScorePages(const ScoreParams& p, cudaStream_t stream);

// mode: 0 resolve, 1 stage, 2 load now (engine/sparse_ops.h's SelectMode).
struct SelectParams {
  const RowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t mode = 0;
  bool stage_ranked = false;
  bool skip_missing = false;
  bool urgent = false;
  int32_t max_cache_slots = 0;  // the most of any row: sizes the block's shared memory
  const float* scores = nullptr;
  Pool device;
  Pool host;
  PageGeometry geometry;
  int32_t* list_pages = nullptr;
  int32_t* list_tokens = nullptr;
  int32_t* list_count = nullptr;
  GatherEntry* copies = nullptr;
  int32_t* copy_count = nullptr;
  int32_t copy_stride = 0;
  int64_t* counters = nullptr;
};
cudaError_t SelectPages(const SelectParams& p, cudaStream_t stream);
// The most cache slots per sequence SelectPages can handle on the current device (its shared
// memory holds each (row, KV head)'s slots); 0 when the device cannot be queried.
int32_t MaxSelectCacheSlots();

struct GatherParams {
  const GatherEntry* copies = nullptr;
  const int32_t* copy_count = nullptr;
  int32_t lists = 0;
  int32_t copy_stride = 0;
  int64_t page_bytes = 0;
  int32_t* pages_gathered = nullptr;  // mapped pinned host memory, or null
};
cudaError_t GatherPages(const GatherParams& p, cudaStream_t stream);

struct RetireParams {
  const RowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t max_cache_slots = 0;
  Pool device;
};
cudaError_t RetireWindowPages(const RetireParams& p, cudaStream_t stream);

struct CompleteParams {
  const RowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  Pool device;
  Pool host;
  PageGeometry geometry;
  float* summaries = nullptr;  // null: none
};
cudaError_t CompletePages(const CompleteParams& p, cudaStream_t stream);

struct SummaryParams {
  const int32_t* src = nullptr;
  const int32_t* dst = nullptr;
  int32_t count = 0;
  Pool pool;
  PageGeometry geometry;
  float* summaries = nullptr;
};
cudaError_t SummarizePages(const SummaryParams& p, cudaStream_t stream);

}  // namespace specula::kernels
