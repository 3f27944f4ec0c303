// Where the KV pages of one (row, KV head) list are, for the dense and the sparse layout of
// kernels/attention.h, and which of them a block takes: the attention kernels of attention.cu are
// written once over these.
#pragma once

#include <cstdint>

#include "engine/common/ceil_div.h"
#include "kernels/attention.h"

namespace specula::kernels {

// Entry e of a list: its first byte and its valid tokens.
struct DenseLists {
  const int32_t* row_keys;
  const int32_t* row_block_begin;
  const int32_t* blocks;
  const char* kv_base;
  int64_t page_bytes;
  int32_t page_size;
  int32_t num_kv_heads;
  __device__ int32_t count(int32_t row, int32_t) const {
    return static_cast<int32_t>(CeilDiv(row_keys[row], page_size));
  }
  __device__ const char* entry(int32_t row, int32_t kv_head, int32_t e, int32_t* tokens) const {
    *tokens = min(page_size, row_keys[row] - e * page_size);
    return kv_base +
           (static_cast<int64_t>(blocks[row_block_begin[row] + e]) * num_kv_heads + kv_head) *
               page_bytes;
  }
};

// A negative page is HostPageRef(p): page p of the host store, read through its mapped address.
struct SparseLists {
  const int32_t* list_begin;
  const int32_t* list_count;
  const int32_t* pages;
  const int32_t* page_tokens;
  const char* kv_base;
  const char* host_base;
  int64_t page_bytes;
  int32_t num_kv_heads;
  __device__ int32_t count(int32_t row, int32_t kv_head) const {
    return list_count[row * num_kv_heads + kv_head];
  }
  __device__ const char* entry(int32_t row, int32_t kv_head, int32_t e, int32_t* tokens) const {
    const int32_t at = list_begin[row * num_kv_heads + kv_head] + e;
    *tokens = page_tokens[at];
    const int32_t ref = pages[at];
    return ref < 0 ? host_base + static_cast<int64_t>(-1 - ref) * page_bytes
                   : kv_base + static_cast<int64_t>(ref) * page_bytes;
  }
};

// The part of the work one block of a decode attention kernel takes, from its place in the grid
// (rows * num_kv_heads, splits, chunks of `heads_per_block` query heads).
struct BlockPart {
  int32_t row;
  int32_t kv_head;
  int32_t head0;    // its first query head
  int32_t heads;    // query heads it takes (fewer in a group's last chunk)
  int32_t e_begin;  // its split of the (row, kv_head) list: entries [e_begin, e_end)
  int32_t e_end;
};

template <typename Lists>
__device__ __forceinline__ BlockPart BlockPartOf(const AttentionCommon& p, const Lists& lists,
                                                 int32_t splits, int32_t heads_per_block) {
  BlockPart b;
  b.row = blockIdx.x / p.num_kv_heads;
  b.kv_head = blockIdx.x % p.num_kv_heads;
  const int32_t group = p.num_heads / p.num_kv_heads;
  const auto chunk = static_cast<int32_t>(blockIdx.z);
  b.head0 = b.kv_head * group + chunk * heads_per_block;
  b.heads = min(heads_per_block, group - chunk * heads_per_block);
  const int32_t count = lists.count(b.row, b.kv_head);
  const auto per_split = static_cast<int32_t>(CeilDiv(count, splits));
  b.e_begin = static_cast<int32_t>(blockIdx.y) * per_split;
  b.e_end = min(count, b.e_begin + per_split);
  return b;
}

}  // namespace specula::kernels
