// The operations the forward pass and the KV caches need, implemented once per device kind
// (engine/cpu/ is the reference; engine/cuda/ follows the same semantics). The model code in
// engine/model/ and the caches in engine/kv/ are written against this interface only.
//
// Conventions (the shape of a GPU):
// - Every operation is enqueued on the compute stream (compute_stream()) in call order and may
//   run later; the host waits only in Synchronize, CopyToHost and Event::Synchronize. Page copies
//   that overlap compute run on streams from CreateStream(), ordered with events
//   (engine/backend/stream.h).
// - Metadata an operation reads (token ids, positions, block tables, page lists) is a DeviceSpan
//   into backend memory, uploaded once per step (engine/backend/step_plan.h), never a host pointer.
// - Activations are fp32 matrices (Mat); weights are stored in the backend's format
//   (a WeightUploader converts); KV pages hold K and V in the view's dtype (f32, bf16 or f16) and
//   attention computes in fp32.
// - Threading: a Backend instance is used by one engine thread at a time; copy streams are each
//   used by one thread at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend_types.h"
#include "engine/backend/sparse_ops.h"
#include "engine/backend/stream.h"
#include "engine/common/buffer.h"
#include "engine/common/dtype.h"
#include "engine/common/weight_parts.h"
#include "kernels/sampling_abi.h"

namespace specula {

// Puts a model's weights into backend memory, each converted once from the checkpoint's dtype
// into the backend's weight format. Used by one thread; the weights are ready for operations
// enqueued on the compute stream after Upload returns, and the parts' memory may be reused then.
class WeightUploader {
 public:
  // Waits for the copies still reading the staging memory.
  virtual ~WeightUploader() = default;
  // A weight [out, in] holding the concatenation of `parts` (out * in elements in all). Vectors
  // (norm weights, biases) are uploaded as [1, n].
  virtual absl::StatusOr<Weight> Upload(absl::Span<const WeightPart> parts, int64_t out,
                                        int64_t in) = 0;
};

// Host staging a weight upload may use: enough for copies to overlap the filling threads.
inline constexpr size_t kWeightStagingBytes = size_t{64} << 20;

// Operations recorded once on the compute stream (a CUDA graph) and enqueued again as a whole:
// one launch instead of one per operation. Each replay reads and writes the addresses recorded,
// so what differs between replays must be written into that memory first (the step plan's
// upload, itself enqueued before the replay).
class RecordedOps {
 public:
  virtual ~RecordedOps() = default;
  // Enqueues the recorded operations on the compute stream. False, with nothing enqueued, when
  // backend memory they used has moved since they were recorded: record them again.
  virtual bool Replay() = 0;
};

// What a backend counts for tests and benchmarks: times the host thread blocked on device work
// (a stream's or an event's Synchronize, and CopyToHost, which waits before it reads), and reads
// of backend memory into host memory (CopyToHost). A decode step needs one of each: the logits'
// readback. A stream waiting on an event (Stream::Wait) is not a host synchronization.
struct BackendCounters {
  std::atomic<int64_t> host_syncs{0};
  std::atomic<int64_t> host_reads{0};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Whether backend memory is ordinary host memory the host may read at any time without a copy
  // (the CPU backend). Evaluation hooks that inspect the device's state in place (the attention
  // observer, the recall probe) need it; a GPU would need a readback per layer instead.
  virtual bool memory_is_host_readable() const = 0;
  // The KV page dtype `kv_cache.dtype: auto` resolves to on this backend.
  virtual DType default_kv_dtype() const = 0;

  // --- Memory ---
  // Backend (device) memory. RESOURCE_EXHAUSTED when the device cannot hold `bytes`.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  // Host memory the device can copy from and to asynchronously and that device operations may
  // read and write directly (page-locked and mapped on a GPU): the host KV store and the staging
  // buffers of uploads and readbacks live in it. Committed lazily where the platform allows, so
  // resident memory grows with use. RESOURCE_EXHAUSTED when it cannot be had.
  virtual absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) = 0;
  // Synchronous copy to the device: the source may be reused at return (weights, not per step).
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  // Copy on the compute stream from pinned host memory, which must stay unchanged until the
  // stream has passed the copy (an event recorded after it is done).
  virtual void CopyToDeviceAsync(void* dst, const void* pinned_src, size_t bytes) = 0;
  // Waits for the compute stream, then reads: a counted sync and host read.
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Sets `bytes` bytes of backend memory to `value`, on the compute stream.
  virtual void Memset(void* dst, int value, size_t bytes) = 0;

  // --- Streams ---
  virtual Stream& compute_stream() = 0;
  // Blocks until the compute stream is idle.
  void Synchronize() { compute_stream().Synchronize(); }
  // A stream for copies that overlap compute (the prefetch's); many may exist at once, each used
  // by one thread at a time.
  virtual std::unique_ptr<Stream> CreateStream() = 0;
  const BackendCounters& counters() const { return counters_; }
  // A fault that left the device unusable, seen at a readback (CopyToHost): a sticky CUDA error
  // such as an illegal address or a lost GPU, or the injected Fault::kDeviceLost. OK until then;
  // after it, nothing the device computes can be trusted, and the server must restart. Engine
  // thread.
  const absl::Status& device_fault() const { return device_fault_; }

  // For loading many weights: keeps its staging (pinned buffers, fill threads) until destroyed.
  // `staging_bytes` bounds the host staging memory of a backend that needs some.
  virtual std::unique_ptr<WeightUploader> CreateWeightUploader(size_t staging_bytes) = 0;
  // One weight from fp32 [out, in] on the host (tests, small tables).
  absl::StatusOr<Weight> UploadWeight(const float* data, int64_t out, int64_t in);

  // --- The forward pass (compute stream) ---
  // y = x · wᵀ (+ bias). x [m, w.in], y [m, w.out]; bias may be empty.
  virtual void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) = 0;
  // y[r] = x[r] / rms(x[r]) * weight, over `cols`; y may alias x.
  virtual void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) = 0;
  // In place on x [tokens, num_heads * head_dim]: rotate-half RoPE at positions[token] with
  // angles position * inv_freq[i], i < head_dim / 2.
  virtual void Rope(Mat* x, int32_t num_heads, int32_t head_dim,
                    DeviceSpan<const int32_t> positions, DeviceSpan<const float> inv_freq) = 0;
  // out = silu(gate_up[:, :n]) * gate_up[:, n:], n = out->cols.
  virtual void SwiGlu(const Mat& gate_up, Mat* out) = 0;
  // out[i] = table row ids[i]. Ids must be in the table (the planner checks them).
  virtual void Embed(DeviceSpan<const int32_t> ids, const Weight& table, Mat* out) = 0;
  // x += y.
  virtual void Add(Mat* x, const Mat& y) = 0;
  // Fused forms a backend may run in fewer passes over memory; each is defined as the
  // composition its default runs, which is the reference the fused kernels are tested against.
  // x += residual, then y = RmsNorm(x): the residual stream's add and the next sublayer's norm.
  virtual void AddRmsNorm(Mat* x, const Mat& residual, const Weight& weight, float eps, Mat* y) {
    Add(x, residual);
    RmsNorm(*x, weight, eps, y);
  }
  // In place, RmsNorm over each of `num_heads` vectors of `head_dim` in each row of x (Qwen3's
  // q and k norms, one weight of head_dim for every head).
  virtual void HeadRmsNorm(Mat* x, int32_t num_heads, int32_t head_dim, const Weight& weight,
                           float eps) {
    for (int32_t h = 0; h < num_heads; ++h) {
      Mat head = x->Cols(static_cast<int64_t>(h) * head_dim, head_dim);
      RmsNorm(head, weight, eps, &head);
    }
  }
  // out[i] = src[rows[i]].
  virtual void GatherRows(const Mat& src, DeviceSpan<const int32_t> rows, Mat* out) = 0;

  // --- Attention and KV pages (compute stream) ---
  // Writes the K and V rows of new tokens (k, v: [tokens, num_kv_heads * head_dim]) into pages.
  virtual void WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
                       const KvLayerView& layer) = 0;
  // Causal softmax attention of q [tokens, num_heads * head_dim] over paged KV; out like q.
  virtual void PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                              Mat* out) = 0;
  // Softmax attention of decode rows over page lists of `device_pool` and `host_pool`; out like
  // q. Given every page of a sequence in order, equals PagedAttention.
  virtual void SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                     const PagePoolView& device_pool, const PagePoolView& host_pool,
                                     Mat* out) = 0;

  // --- The sparse KV cache on the device (engine/backend/sparse_ops.h; compute stream) ---
  virtual void ScorePages(const Mat& q, const SparseScoreArgs& args) = 0;
  virtual void SelectPages(const SparseSelectArgs& args) = 0;
  virtual void RetireWindowPages(const SparseRetireArgs& args) = 0;
  virtual void CompletePages(const SparseCompleteArgs& args) = 0;
  virtual void SummarizePages(const PageSummaryArgs& args) = 0;
  // On `stream`, a copy stream from CreateStream(): loads the staged pages and marks them ready.
  virtual void GatherPages(Stream& stream, const PageGatherArgs& args) = 0;
  // --- Recording (compute stream) ---
  // Whether Record can record (not the CPU backend, which runs each operation as it is
  // enqueued).
  virtual bool can_record() const { return false; }
  // Records the operations `enqueue` issues on the compute stream instead of running them. Null
  // when this backend cannot record, or when the recording could not be completed (then nothing
  // ran, and the caller runs the operations itself). An operation that fails while recording is
  // as fatal as one that fails to launch.
  virtual std::unique_ptr<RecordedOps> Record(absl::FunctionRef<void()> enqueue) { return nullptr; }

  // --- Sampling (compute stream) ---
  // out[r] = the token (and logprobs) rows[r] chooses from row r of `logits` [rows, vocab], by
  // the method of kernels/sampling_abi.h; `rows` and `out` are in this backend's memory.
  virtual void SampleRows(const Mat& logits, DeviceSpan<const RowSampling> rows,
                          DeviceSpan<SampledRow> out) = 0;
  // A grammar's masks, applied where the logits are, before SampleRows: for each i, row rows[i]
  // of `logits` gets -inf at every token whose bit is clear in mask i (bit t % 32 of word t / 32
  // of bits[i * words, (i + 1) * words), words = ceil(logits.cols / 32)). NaN and +inf stay, so
  // SampleRows still reports a model that overflowed. `rows` and `bits` are in this backend's
  // memory.
  virtual void MaskLogits(const Mat& logits, DeviceSpan<const int32_t> rows,
                          DeviceSpan<const uint32_t> bits) = 0;

  // The most cache slots a sparse sequence may have per (layer, KV head): a GPU's selection keeps
  // them in a block's shared memory. Unbounded on the CPU.
  virtual int32_t max_sparse_cache_slots() const { return std::numeric_limits<int32_t>::max(); }

 protected:
  BackendCounters counters_;
  absl::Status device_fault_;
};

inline absl::StatusOr<Weight> Backend::UploadWeight(const float* data, int64_t out, int64_t in) {
  const WeightPart part{DType::kF32, data, out * in};
  const size_t bytes = static_cast<size_t>(out * in) * sizeof(float);
  return CreateWeightUploader(std::min(bytes, kWeightStagingBytes))->Upload({&part, 1}, out, in);
}

// Reads rows of `m` to the host in one CopyToHost (one synchronization): `host` receives the
// span from row 0 to the end of the last row, so row r starts at host->data() + r * m.stride.
inline void ReadRowsToHost(Backend& backend, const Mat& m, std::vector<float>* host) {
  if (m.rows == 0) return host->clear();
  host->resize(static_cast<size_t>((m.rows - 1) * m.stride + m.cols));
  backend.CopyToHost(host->data(), m.data, host->size() * sizeof(float));
}

}  // namespace specula
