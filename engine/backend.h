// The operations the forward pass needs, implemented once per device kind (engine/cpu/ is the
// reference; engine/cuda/ follows the same semantics). The model code in engine/model/ is written
// against this interface only.
//
// Conventions:
// - Activations are 2-D row-major matrices [rows = tokens, cols = features] of fp32 on every
//   backend; weights are stored in whatever format the backend prefers (UploadWeight converts).
// - KV pages hold K and V in the view's dtype (f32, bf16 or f16); attention computes in fp32.
// - Small per-step metadata (token ids, positions, page tables) is passed as host spans; a device
//   backend copies them itself.
// - Streams and events (engine/stream.h): compute runs on compute_stream(); page copies that
//   overlap it run on streams from CreateStream() and are ordered against compute with events.
// - Threading: a Backend instance is used by one engine thread at a time.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/buffer.h"
#include "engine/common/dtype.h"
#include "engine/stream.h"

namespace specula {

// A view of a row-major fp32 matrix in backend memory; `stride` = elements between rows.
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
};

// One sequence's part of a batched attention call.
struct AttentionSeq {
  int32_t q_begin = 0;  // first row of this sequence in q / out
  int32_t q_len = 0;    // query rows (1 for decode, the chunk length for prefill)
  int32_t kv_len = 0;   // keys in the cache, including the ones this step wrote
  int32_t block_begin = 0;  // offset of this sequence's block table in AttentionBatch::blocks
  // Query row i sits at key position kv_len - q_len + i and sees keys [0, that position].
};

// Softmax scale of scaled dot-product attention, 1/sqrt(head_dim): the one definition every
// attention path (dense, sparse, recall probes) uses.
inline float AttentionScale(int32_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

struct AttentionBatch {
  absl::Span<const AttentionSeq> seqs;
  absl::Span<const int32_t> blocks;  // concatenated block tables
  int32_t num_heads = 0;             // query heads; a GQA group shares KV head h / group
  float scale = 1.0f;
};

// A pool of single-head pages, each K [page_size][head_dim] then V [page_size][head_dim]: the
// host KV store and the sparse working set. Page p starts at base + p * page_elems(). A dense
// layer's KvLayerView is such a pool too, page (block b, KV head h) being b * num_kv_heads + h.
struct PagePoolView {
  void* base = nullptr;
  DType dtype = DType::kF32;
  int32_t page_size = 0;
  int32_t head_dim = 0;
  size_t page_elems() const { return static_cast<size_t>(2) * page_size * head_dim; }
};

// Decode attention over a chosen set of pages: for query row r and KV head h, the pages
// pages[page_begin[r * num_kv_heads + h] .. page_begin[r * num_kv_heads + h + 1]), in the order
// given (attention reads keys in that order), each with its first page_tokens[i] tokens valid.
// No causal mask: every chosen token precedes or is the row's own position.
struct SparseAttentionBatch {
  absl::Span<const int32_t> page_begin;   // rows * num_kv_heads + 1 offsets into pages
  absl::Span<const int32_t> pages;        // page ids in the pool
  absl::Span<const int32_t> page_tokens;  // valid tokens of each entry of `pages`, >= 1
  int32_t num_heads = 0;                  // query heads
  int32_t num_kv_heads = 0;
  float scale = 1.0f;
};

// Where each new token's K/V goes: block id and slot within the page.
struct KvWrite {
  absl::Span<const int32_t> blocks;   // per token
  absl::Span<const int32_t> offsets;  // per token, in [0, page_size)
};

// What a backend counts for tests and benchmarks: times the host waited for the compute stream
// (Synchronize, and CopyToHost, which waits before it reads), and reads of backend memory into
// host memory (CopyToHost). A decode step needs one of each: the logits' readback.
struct BackendCounters {
  std::atomic<int64_t> compute_syncs{0};
  std::atomic<int64_t> host_reads{0};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The KV page dtype `kv_cache.dtype: auto` resolves to on this backend.
  virtual DType default_kv_dtype() const = 0;

  // Memory. RESOURCE_EXHAUSTED when the device cannot hold `bytes`.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  // Host memory the device can copy from and to asynchronously (page-locked on a GPU): the host
  // KV store lives in it. Committed lazily where the platform allows, so resident memory grows
  // with use. RESOURCE_EXHAUSTED when it cannot be had.
  virtual absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) = 0;
  // Synchronous copies on the compute stream: CopyToDevice is ordered before later compute;
  // CopyToHost waits for the compute stream first and counts as a host read.
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;

  // Every operation below runs on the compute stream, in call order. The host spans passed to
  // them are read at the call.
  virtual Stream& compute_stream() = 0;
  // Blocks until the compute stream is idle.
  void Synchronize() { compute_stream().Synchronize(); }
  // A stream for copies that overlap compute (one per prefetch thread); many may exist at once,
  // each used by one thread at a time.
  virtual std::unique_ptr<Stream> CreateStream() = 0;
  const BackendCounters& counters() const { return counters_; }

  // `data` is fp32 [out, in] on the host; the backend keeps its own copy in its weight format.
  virtual absl::StatusOr<Weight> UploadWeight(const float* data, int64_t out, int64_t in) = 0;

  // y = x · wᵀ (+ bias). x [m, w.in], y [m, w.out]; bias may be empty.
  virtual void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) = 0;
  // y[r] = x[r] / rms(x[r]) * weight, over `cols`; y may alias x.
  virtual void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) = 0;
  // In place on x [tokens, num_heads * head_dim]: rotate-half RoPE at positions[token] with
  // angles position * inv_freq[i], i < head_dim / 2.
  virtual void Rope(Mat* x, int32_t num_heads, int32_t head_dim,
                    absl::Span<const int32_t> positions, absl::Span<const float> inv_freq) = 0;
  // out = silu(gate_up[:, :n]) * gate_up[:, n:], n = out->cols.
  virtual void SwiGlu(const Mat& gate_up, Mat* out) = 0;
  // out[i] = table row ids[i].
  virtual void Embed(absl::Span<const int32_t> ids, const Weight& table, Mat* out) = 0;
  // x += y.
  virtual void Add(Mat* x, const Mat& y) = 0;
  // out[i] = src[rows[i]].
  virtual void GatherRows(const Mat& src, absl::Span<const int32_t> rows, Mat* out) = 0;

  // Writes the K and V rows of new tokens (k, v: [tokens, num_kv_heads * head_dim]) into pages.
  virtual void WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
                       const KvLayerView& layer) = 0;
  // Causal softmax attention of q [tokens, num_heads * head_dim] over paged KV; out like q.
  virtual void PagedAttention(const Mat& q, const AttentionBatch& batch,
                              const KvLayerView& layer, Mat* out) = 0;
  // Softmax attention of decode rows q [rows, num_heads * head_dim] over the pages `batch` picks
  // from `pool`; out like q. Given every page of a sequence in order, equals PagedAttention.
  virtual void SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                     const PagePoolView& pool, Mat* out) = 0;

 protected:
  BackendCounters counters_;
};

// Reads rows of `m` to the host in one CopyToHost (one synchronization): `host` receives the
// span from row 0 to the end of the last row, so row r starts at host->data() + r * m.stride.
inline void ReadRowsToHost(Backend& backend, const Mat& m, std::vector<float>* host) {
  if (m.rows == 0) return host->clear();
  host->resize(static_cast<size_t>((m.rows - 1) * m.stride + m.cols));
  backend.CopyToHost(host->data(), m.data, host->size() * sizeof(float));
}

}  // namespace specula
