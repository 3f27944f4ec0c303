// The sparse KV cache's device operations (semantics: engine/backend/sparse_ops.h; reference:
// engine/cpu/cpu_sparse_ops.cc): page scoring, top-k selection with residency bookkeeping and
// staging, the copy stream's page gather, window retirement, page completion and summaries.
//
// The plan rows, residency arrays and copy entries are kernels/sparse_abi.h's, the engine's own
// definitions: a plan written by the host is read here as is. Pointers are device memory, or
// pinned host memory read through its mapping (the host store).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/sparse_abi.h"

namespace specula::kernels {

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
  const SparseRowPlan* rows = nullptr;
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

struct SelectParams {
  const SparseRowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  SelectMode mode = SelectMode::kResolve;
  bool stage_ranked = false;
  bool defer_missing = false;
  bool urgent = false;
  int32_t max_cache_slots = 0;  // the most of any row: sizes the block's shared memory
  const float* scores = nullptr;
  Pool device;
  Pool host;
  PageGeometry geometry;
  int32_t* list_pages = nullptr;
  int32_t* list_tokens = nullptr;
  int32_t* list_count = nullptr;
  PageGatherEntry* copies = nullptr;
  int32_t* copy_count = nullptr;
  int32_t copy_stride = 0;
  int64_t* counters = nullptr;
};
cudaError_t SelectPages(const SelectParams& p, cudaStream_t stream);
// The most cache slots per sequence SelectPages can handle on the current device (its shared
// memory holds each (row, KV head)'s slots); 0 when the device cannot be queried.
int32_t MaxSelectCacheSlots();

struct GatherParams {
  const PageGatherEntry* copies = nullptr;
  const int32_t* copy_count = nullptr;
  int32_t lists = 0;
  int32_t copy_stride = 0;
  int64_t page_bytes = 0;
  int32_t* pages_gathered = nullptr;  // mapped pinned host memory, or null
};
cudaError_t GatherPages(const GatherParams& p, cudaStream_t stream);

struct RetireParams {
  const SparseRowPlan* rows = nullptr;
  int32_t num_rows = 0;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t max_cache_slots = 0;
  Pool device;
};
cudaError_t RetireWindowPages(const RetireParams& p, cudaStream_t stream);

struct CompleteParams {
  const SparseRowPlan* rows = nullptr;
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
