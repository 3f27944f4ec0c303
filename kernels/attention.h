// Softmax attention of query rows over lists of KV pages (the layout of
// engine/backend/backend_types.h): the dense paged attention (causal, each row sees the first
// row_keys[row] keys of its block table) and the sparse decode attention (each (row, KV head) reads
// its own list of pages, each with a count of valid tokens). Each kernel serves both, so given the
// same keys in the same order they agree. Design:
// - One thread block per (row, KV head, split of the list): the GQA group's query heads (up to 8
//   per block) share every K/V load; 4 warps take the pages of the split in turn.
// - The vector kernel (attention_vector.cuh) reads a token's row with 16-byte loads across
//   head_dim / 8 lanes (bf16/f16), several tokens per warp instruction and several loads in flight
//   per lane; shapes it cannot serve (rows that are not whole 16-byte loads over at most 32
//   lanes) take the row kernel, where a key is read by the 32 lanes of a warp, head_dim / 32
//   channels each, one token at a time.
// - Online softmax in fp32; the warps' partial results merge in shared memory.
// - Split-K: when rows x KV heads cannot fill the GPU, a list is cut into splits whose partial
//   (max, sum, accumulator) go to `scratch` and a second kernel combines them.
// head_dim must be at most 256.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"

namespace specula::kernels {

struct AttentionCommon {
  const float* q = nullptr;  // [rows, num_heads * head_dim]
  int64_t q_stride = 0;
  float* out = nullptr;  // like q
  int64_t out_stride = 0;
  int32_t rows = 0;
  int32_t num_heads = 0;     // query heads; head h reads KV head h / (num_heads / num_kv_heads)
  int32_t num_kv_heads = 0;  // of the lists (dense: of the layer's blocks)
  int32_t head_dim = 0;
  int32_t page_size = 0;
  float scale = 1.0f;
  const void* kv_base = nullptr;  // page p at kv_base + p * 2 * page_size * head_dim elements
  DType dtype = DType::kF32;
  // The longest list in pages (it sizes the split).
  int32_t max_pages = 0;
  // Split-K workspace: AttentionScratchFloats(...) floats, or null to run without splits.
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  int32_t sm_count = 1;
};

// Dense: row r attends to keys [0, row_keys[r]) of its sequence: key j lives in page
// blocks[row_block_begin[r] + j / page_size] * num_kv_heads + kv_head, row j % page_size.
struct PagedAttentionParams {
  AttentionCommon common;
  const int32_t* row_keys = nullptr;
  const int32_t* row_block_begin = nullptr;
  const int32_t* blocks = nullptr;
};
cudaError_t PagedAttention(const PagedAttentionParams& p, cudaStream_t stream);

// Sparse: row r, KV head h attends to list_count[l] entries from list_begin[l], l = r *
// num_kv_heads + h, each with its first page_tokens[i] tokens: page pages[i] of kv_base, or when
// negative page -1 - pages[i] of host_base (pinned host memory read through its mapping).
struct SparseAttentionParams {
  AttentionCommon common;
  const int32_t* list_begin = nullptr;
  const int32_t* list_count = nullptr;
  const int32_t* pages = nullptr;
  const int32_t* page_tokens = nullptr;
  const void* host_base = nullptr;
};
cudaError_t SparseDecodeAttention(const SparseAttentionParams& p, cudaStream_t stream);

// Merges `splits` partial results per (row, query head) from p.scratch into p.out: slot
// (row * num_heads + head) * splits + split of S = rows * num_heads * splits slots holds the
// running max (natural-log units) at scratch[slot], the sum at scratch[S + slot] and the
// unnormalized output at scratch[2 * S + slot * head_dim]. A max of -inf marks an empty split.
cudaError_t CombineAttentionSplits(const AttentionCommon& p, int32_t splits, cudaStream_t stream);

// Floats of split-K workspace for `rows` x `num_heads` with up to `splits` splits.
size_t AttentionScratchFloats(int32_t rows, int32_t num_heads, int32_t head_dim, int32_t splits);

// The most splits, up to `splits`, whose workspace fits in `scratch_floats`; at least 1.
int32_t SplitsWithinScratch(int32_t rows, int32_t num_heads, int32_t head_dim, int64_t splits,
                            size_t scratch_floats);

}  // namespace specula::kernels
