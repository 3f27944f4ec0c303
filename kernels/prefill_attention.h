// Causal attention of prefill chunks over paged KV on the tensor cores (FlashAttention-2's
// scheme, written for specula's page layout). Where the row kernel (attention.h) gives every
// query row its own pass over the keys, here a block (4 warps) takes a tile of 64 or 128 query
// rows of one sequence and one query head, streams the sequence's K/V tiles of 32 or 64 keys from
// the pages into shared memory (cp.async, double-buffered, zero-filled past the last key), and
// computes S = QKᵀ and O += PV with bf16/f16 mma.sync (fp32 accumulation) and an online softmax
// in fp32. Key tiles past the tile's last row are never read (causal skipping); the mask is
// applied only on tiles that cross a row's last key.
//
// Precision: Q and the softmax weights P are rounded to the KV dtype before each matrix product,
// as every flash kernel does (FlashAttention, FlashInfer); the row kernel keeps them fp32. The
// relative error is that of bf16 (about 2^-9 per product), which the tests bound.
//
// The rows of a sequence are contiguous and share one block table (seq_rows); a batch may mix
// sequences of any lengths, including single decode rows, and prefixes cached before the chunk.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace specula::kernels {

struct PrefillAttentionParams {
  const float* q = nullptr;  // [rows, num_heads * head_dim]
  int64_t q_stride = 0;
  float* out = nullptr;  // like q
  int64_t out_stride = 0;
  int32_t num_heads = 0;  // query head h reads KV head h / (num_heads / num_kv_heads)
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  float scale = 1.0f;
  const void* kv_base = nullptr;  // page p at kv_base + p * 2 * page_size * head_dim elements
  DType dtype = DType::kBF16;
  // Row r attends to keys [0, row_keys[r]) of its table: key j in page
  // blocks[row_block_begin[r] + j / page_size] * num_kv_heads + kv_head, row j % page_size.
  const int32_t* row_keys = nullptr;
  const int32_t* row_block_begin = nullptr;
  const int32_t* blocks = nullptr;
  // Sequence s owns rows [seq_rows[s], seq_rows[s + 1]), all with row_block_begin of its first.
  const int32_t* seq_rows = nullptr;
  int32_t seqs = 0;
  int32_t max_seq_rows = 0;  // the most rows of any sequence (host-known: sizes the grid)
  int32_t sm_count = 1;      // picks the tile size and the splits that fill the GPU
  // Split-K when the tiles cannot fill the GPU (a single chunk): each split of a tile's key
  // range writes a partial result to `scratch` (null: no splits) and CombineAttentionSplits
  // merges them.
  int32_t rows = 0;  // rows of the batch
  float* scratch = nullptr;
};

// What the launch decides with beside the kernel's parameters. (Kept out of the kernel's
// parameter block: adding them there changed the register allocation, up to 88 bytes of spills.)
struct PrefillAttentionLaunch {
  PrefillAttentionParams params;
  int32_t max_keys = 0;       // the most keys any row attends to
  size_t scratch_floats = 0;  // of params.scratch: AttentionScratchFloats(rows, heads, dim, splits)
};

// Whether the kernel handles this KV dtype and head size (bf16 or f16; head_dim 64 or 128).
bool PrefillAttentionSupports(DType dtype, int32_t head_dim);

cudaError_t PrefillAttention(const PrefillAttentionLaunch& launch, cudaStream_t stream);

}  // namespace specula::kernels
