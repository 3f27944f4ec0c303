// The data the Backend's operations take: matrix and KV-page views of backend memory, and the
// per-operation parameters whose metadata (block tables, page lists) lives in backend memory as
// DeviceSpans, uploaded once per step (engine/backend/step_plan.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "engine/backend/device_span.h"
#include "engine/common/buffer.h"
#include "engine/common/dtype.h"

namespace specula {

// A view of a row-major fp32 matrix in backend memory; `stride` = elements between rows.
// Activations are fp32 on every backend: the CPU backend stays an exact fp32 reference, and the
// CUDA backend converts a GEMM's input to bf16 inside the GEMM (docs/CUDA.md).
struct Mat {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;

  Mat() = default;
  Mat(float* d, int64_t r, int64_t c) : data(d), rows(r), cols(c), stride(c) {}
  Mat(float* d, int64_t r, int64_t c, int64_t s) : data(d), rows(r), cols(c), stride(s) {}
  float* row(int64_t r) const { return data + r * stride; }
  // Columns [begin, begin + n) of every row.
  Mat Cols(int64_t begin, int64_t n) const { return Mat(data + begin, rows, n, stride); }
  Mat Rows(int64_t begin, int64_t n) const { return Mat(data + begin * stride, n, cols, stride); }
};

// A weight matrix [out, in] (PyTorch nn.Linear layout) or a vector (out = 1) in backend format.
struct Weight {
  DeviceBuffer buffer;
  DType dtype = DType::kF32;
  int64_t out = 0;
  int64_t in = 0;
  bool empty() const { return buffer.data() == nullptr; }
};

// KV pages of one layer. A page holds `page_size` tokens of one KV head: K [page_size][head_dim]
// followed by V [page_size][head_dim]. Block b's page for head h sits at index b * num_kv_heads + h
// from `base`, so one block table per sequence serves every layer and head.
struct KvLayerView {
  void* base = nullptr;
  DType dtype = DType::kF32;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;
  int32_t head_dim = 0;
  size_t page_elems() const { return static_cast<size_t>(2) * page_size * head_dim; }
  size_t page_bytes() const { return page_elems() * DTypeSize(dtype); }
};

// A pool of single-head pages, each K [page_size][head_dim] then V [page_size][head_dim]: the
// host KV store, or a dense layer's pages seen one head at a time (page (block b, KV head h) is
// b * num_kv_heads + h). Page p starts at base + p * page_bytes().
struct PagePoolView {
  void* base = nullptr;
  DType dtype = DType::kF32;
  int32_t page_size = 0;
  int32_t head_dim = 0;
  size_t page_elems() const { return static_cast<size_t>(2) * page_size * head_dim; }
  size_t page_bytes() const { return page_elems() * DTypeSize(dtype); }
  void* page(int64_t p) const { return static_cast<char*>(base) + p * page_bytes(); }
};

inline PagePoolView PagesOf(const KvLayerView& layer) {
  return PagePoolView{layer.base, layer.dtype, layer.page_size, layer.head_dim};
}

// Softmax scale of plain scaled dot-product attention, 1/sqrt(head_dim). A model's own scale
// also carries its rotary attention factor (ModelConfig::softmax_scale); the attention paths
// (dense, sparse, recall probes) are handed that one.
inline float AttentionScale(int32_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// Causal attention of rows [first_row, first_row + rows) of q over paged KV: row r attends to
// keys [0, row_keys[r]) of its block table, key j living in page
// blocks[row_block_begin[r] + j / page_size]. A GQA group shares KV head h / group.
struct AttentionBatch {
  int32_t first_row = 0;
  int32_t rows = 0;
  DeviceSpan<const int32_t> row_keys;         // [rows], >= 1
  DeviceSpan<const int32_t> row_block_begin;  // [rows]
  DeviceSpan<const int32_t> blocks;
  int32_t max_keys = 0;  // the largest row_keys (host-known; sizes a GPU's split)
  int32_t num_heads = 0;
  float scale = 1.0f;
  // The sequences, where the planner knows them: sequence s owns rows [seq_rows[s],
  // seq_rows[s + 1]), all with one block table. A GPU attends a sequence's prefill chunk in tiles
  // of rows that share each K/V load; without them (seqs 0) every row is attended alone.
  DeviceSpan<const int32_t> seq_rows;  // [seqs + 1]
  int32_t seqs = 0;
  int32_t max_seq_rows = 0;  // the most rows of one sequence (host-known; sizes a GPU's grid)
};

// Decode attention of rows [first_row, first_row + rows) over chosen pages: row r and KV head h
// read list_count[r * kv_heads + h] entries from list_begin[r * kv_heads + h], in the order given
// (attention reads keys in that order), each with its first page_tokens[e] tokens valid. An
// entry is a page of `device_pool`, or a HostPageRef of `host_pool` (engine/backend/sparse_ops.h).
// No causal mask: every chosen token precedes or is the row's own position.
struct SparseAttentionBatch {
  int32_t first_row = 0;
  int32_t rows = 0;
  DeviceSpan<const int32_t> list_begin;  // [rows * kv_heads]
  DeviceSpan<const int32_t> list_count;  // [rows * kv_heads], >= 1
  DeviceSpan<const int32_t> pages;
  DeviceSpan<const int32_t> page_tokens;
  int32_t max_pages = 0;  // bound on any list's length (host-known; sizes a GPU's split)
  int32_t num_heads = 0;  // query heads
  int32_t num_kv_heads = 0;
  float scale = 1.0f;
};

// Where each new token's K/V goes: block id and slot within the page, per row of k and v.
struct KvWrite {
  DeviceSpan<const int32_t> blocks;
  DeviceSpan<const int32_t> offsets;  // in [0, page_size)
};

}  // namespace specula
