#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_stream.h"
#include "engine/cuda/staging_ring.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/kv_write.h"

namespace specula {
namespace {

constexpr size_t kStagingChunkBytes = size_t{1} << 20;
constexpr int kStagingChunks = 8;
// Split-K workspace of the attention kernels: 64 MiB covers 256 rows x 64 heads x 7 splits at
// head_dim 128 (fewer splits are used when it does not fit).
constexpr size_t kAttentionScratchBytes = size_t{64} << 20;

kernels::Rows ToRows(const Mat& m) { return {m.data, m.rows, m.cols, m.stride}; }

absl::Status AllocationError(const char* what, size_t bytes, cudaError_t e) {
  cudaGetLastError();  // an allocation failure is not sticky; clear it
  return absl::ResourceExhaustedError(absl::StrFormat(
      "cuda backend: cannot allocate %d bytes of %s: %s", bytes, what, cudaGetErrorString(e)));
}

class CudaBackend : public Backend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override {
    // Unchecked: at process exit the CUDA runtime may already be unloading.
    if (compute_ != nullptr) cudaStreamSynchronize(stream());
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  // The streams, cuBLAS and the workspaces, on the current device.
  absl::Status Init() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
    compute_ = std::make_unique<CudaStream>(&counters_.compute_syncs);
    staging_ = std::make_unique<StagingRing>(stream(), kStagingChunkBytes, kStagingChunks);
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return absl::FailedPreconditionError("model.device: cuda: cuBLAS did not initialize");
    }
    CUBLAS_CHECK(cublasSetStream(cublas_, stream()));
    ASSIGN_OR_RETURN(attention_scratch_, Allocate(kAttentionScratchBytes));
    return absl::OkStatus();
  }

  std::string name() const override { return "cuda"; }
  DType default_kv_dtype() const override { return DType::kBF16; }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) return AllocationError("device memory", bytes, e);
    return DeviceBuffer(p, bytes, [](void* q) { cudaFree(q); });
  }

  // Page-locked and mapped: copy engines read it at full PCIe bandwidth, and kernels can read it
  // through the same address (unified addressing).
  absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e =
        cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) return AllocationError("pinned host memory", bytes, e);
    return DeviceBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }

  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    // The source may be reused once this returns: wait for the copy. Not a counted sync (the
    // CPU backend counts none here either): it uploads weights, never runs in a decode step.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    ++counters_.host_reads;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    compute_->Synchronize();
  }

  Stream& compute_stream() override { return *compute_; }
  std::unique_ptr<Stream> CreateStream() override { return std::make_unique<CudaStream>(); }

  absl::StatusOr<Weight> UploadWeight(const float* data, int64_t out, int64_t in) override;
  void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) override;

  void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) override {
    CHECK_EQ(x.cols, weight.in);
    CHECK(weight.dtype == DType::kF32) << "norm weights are kept in fp32";
    Launch(kernels::RmsNorm({ToRows(x), ToRows(*y), weight.buffer.as<float>(), eps}, stream()));
  }

  void Rope(Mat* x, int32_t num_heads, int32_t head_dim, absl::Span<const int32_t> positions,
            absl::Span<const float> inv_freq) override {
    CHECK_EQ(static_cast<int64_t>(positions.size()), x->rows);
    CHECK_EQ(static_cast<int32_t>(inv_freq.size()), head_dim / 2);
    kernels::RopeParams p;
    p.x = ToRows(*x);
    p.num_heads = num_heads;
    p.head_dim = head_dim;
    p.positions = staging_->Upload(positions);
    p.inv_freq = staging_->Upload(inv_freq);
    Launch(kernels::Rope(p, stream()));
  }

  void SwiGlu(const Mat& gate_up, Mat* out) override {
    CHECK_EQ(gate_up.cols, 2 * out->cols);
    Launch(kernels::SwiGlu({ToRows(gate_up), ToRows(*out)}, stream()));
  }

  void Embed(absl::Span<const int32_t> ids, const Weight& table, Mat* out) override {
    CHECK_EQ(out->cols, table.in);
    CHECK_EQ(static_cast<int64_t>(ids.size()), out->rows);
    for (int32_t id : ids) CHECK(id >= 0 && id < table.out) << "token id " << id;
    kernels::EmbedParams p;
    p.ids = staging_->Upload(ids);
    p.table = table.buffer.data();
    p.table_dtype = table.dtype;
    p.vocab = table.out;
    p.out = ToRows(*out);
    Launch(kernels::Embed(p, stream()));
  }

  void Add(Mat* x, const Mat& y) override {
    Launch(kernels::Add({ToRows(*x), ToRows(y)}, stream()));
  }

  void GatherRows(const Mat& src, absl::Span<const int32_t> rows, Mat* out) override {
    CHECK_EQ(src.cols, out->cols);
    CHECK_EQ(static_cast<int64_t>(rows.size()), out->rows);
    for (int32_t r : rows) CHECK(r >= 0 && r < src.rows) << "row " << r;
    Launch(kernels::GatherRows({ToRows(src), staging_->Upload(rows), ToRows(*out)}, stream()));
  }

  void WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
               const KvLayerView& layer) override {
    CHECK(static_cast<int64_t>(where.blocks.size()) >= k.rows &&
          static_cast<int64_t>(where.offsets.size()) >= k.rows);
    kernels::KvWriteParams p;
    p.k = ToRows(k);
    p.v = ToRows(v);
    p.blocks = staging_->Upload(where.blocks);
    p.offsets = staging_->Upload(where.offsets);
    p.base = layer.base;
    p.dtype = layer.dtype;
    p.num_kv_heads = layer.num_kv_heads;
    p.page_size = layer.page_size;
    p.head_dim = layer.head_dim;
    Launch(kernels::WriteKv(p, stream()));
  }

  void PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                      Mat* out) override;
  void SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                             const PagePoolView& pool, Mat* out) override;

 private:
  cudaStream_t stream() const { return compute_->raw(); }
  static void Launch(cudaError_t e) { CUDA_CHECK(e); }
  // The kernels' common parameters: `rows` rows of q and out, over pages of `pool`.
  kernels::AttentionCommon AttentionFor(const Mat& q, Mat* out, int32_t rows, int32_t num_heads,
                                        int32_t num_kv_heads, float scale, const PagePoolView& pool,
                                        int32_t max_pages) const;

  int sm_count_ = 1;
  std::unique_ptr<CudaStream> compute_;
  std::unique_ptr<StagingRing> staging_;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer gemm_input_;  // x in bf16 for cuBLAS, grown to the largest GEMM input
  DeviceBuffer attention_scratch_;
  std::vector<uint16_t> bf16_host_;                  // UploadWeight's conversion buffer
  std::vector<int32_t> row_keys_, row_block_begin_;  // PagedAttention's per-row metadata
};

absl::StatusOr<Weight> CudaBackend::UploadWeight(const float* data, int64_t out, int64_t in) {
  const size_t n = static_cast<size_t>(out) * in;
  Weight w;
  w.out = out;
  w.in = in;
  // Vectors (norm weights, biases; the model loader uploads them as [1, n]) stay fp32: they are
  // tiny, and the kernels that read them compute in fp32. Matrices are bf16, the format of the
  // checkpoints and of cuBLAS's fast path.
  w.dtype = out == 1 ? DType::kF32 : DType::kBF16;
  ASSIGN_OR_RETURN(w.buffer, Allocate(n * DTypeSize(w.dtype)));
  if (w.dtype == DType::kF32) {
    CopyToDevice(w.buffer.data(), data, n * sizeof(float));
    return w;
  }
  std::vector<uint16_t> bf16(n);
  ConvertFromF32(DType::kBF16, data, bf16.data(), n);
  CopyToDevice(w.buffer.data(), bf16.data(), n * sizeof(uint16_t));
  return w;
}

void CudaBackend::Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) {
  CHECK_EQ(x.cols, w.in);
  CHECK_EQ(y->cols, w.out);
  CHECK_EQ(x.rows, y->rows);
  CHECK(w.dtype == DType::kBF16) << "GEMM weights are bf16 on the CUDA backend";
  if (x.rows == 0) return;
  const size_t input_bytes = static_cast<size_t>(x.rows) * x.cols * sizeof(uint16_t);
  if (gemm_input_.bytes() < input_bytes) {
    // Freeing the old buffer (cudaFree) waits for the kernels that read it; a batch larger than
    // any before costs that once.
    auto grown = Allocate(input_bytes);
    CHECK(grown.ok()) << grown.status();
    gemm_input_ = std::move(*grown);
  }
  Launch(kernels::ToBf16({ToRows(x), gemm_input_.data()}, stream()));
  // Row-major y [m, out] is column-major yᵀ [out, m]: yᵀ = W · xᵀ, with W row-major [out, in]
  // read as column-major [in, out] and transposed.
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(
      cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.out), static_cast<int>(x.rows),
      static_cast<int>(w.in), &alpha, w.buffer.data(), CUDA_R_16BF, static_cast<int>(w.in),
      gemm_input_.data(), CUDA_R_16BF, static_cast<int>(x.cols), &beta, y->data, CUDA_R_32F,
      static_cast<int>(y->stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (!bias.empty()) {
    CHECK(bias.dtype == DType::kF32);
    Launch(kernels::AddBias({ToRows(*y), bias.buffer.as<float>()}, stream()));
  }
}

kernels::AttentionCommon CudaBackend::AttentionFor(const Mat& q, Mat* out, int32_t rows,
                                                   int32_t num_heads, int32_t num_kv_heads,
                                                   float scale, const PagePoolView& pool,
                                                   int32_t max_pages) const {
  kernels::AttentionCommon c;
  c.kv_base = pool.base;
  c.dtype = pool.dtype;
  c.page_size = pool.page_size;
  c.head_dim = pool.head_dim;
  c.max_pages = max_pages;
  c.q = q.data;
  c.q_stride = q.stride;
  c.out = out->data;
  c.out_stride = out->stride;
  c.rows = rows;
  c.num_heads = num_heads;
  c.num_kv_heads = num_kv_heads;
  c.scale = scale;
  c.scratch = attention_scratch_.as<float>();
  c.scratch_floats = attention_scratch_.bytes() / sizeof(float);
  c.sm_count = sm_count_;
  return c;
}

void CudaBackend::PagedAttention(const Mat& q, const AttentionBatch& batch,
                                 const KvLayerView& layer, Mat* out) {
  row_keys_.clear();
  row_block_begin_.clear();
  // The sequences tile rows [first, next) of q and out (the sparse prefill passes one sequence
  // in the middle of the batch); the kernel indexes rows from 0.
  const int32_t first = batch.seqs.empty() ? 0 : batch.seqs.front().q_begin;
  int32_t next = first, max_keys = 0;
  for (const AttentionSeq& s : batch.seqs) {
    CHECK_EQ(s.q_begin, next) << "cuda PagedAttention: sequences must tile the rows in order";
    next += s.q_len;
    for (int32_t i = 0; i < s.q_len; ++i) {
      row_keys_.push_back(s.kv_len - s.q_len + i + 1);
      row_block_begin_.push_back(s.block_begin);
    }
    max_keys = std::max(max_keys, s.kv_len);
  }
  const Mat rows_q = q.Rows(first, next - first);
  Mat rows_out = out->Rows(first, next - first);
  kernels::PagedAttentionParams p;
  p.common = AttentionFor(rows_q, &rows_out, next - first, batch.num_heads, layer.num_kv_heads,
                          batch.scale,
                          PagePoolView{layer.base, layer.dtype, layer.page_size, layer.head_dim},
                          static_cast<int32_t>(CeilDiv(max_keys, layer.page_size)));
  p.row_keys = staging_->Upload(absl::MakeConstSpan(row_keys_));
  p.row_block_begin = staging_->Upload(absl::MakeConstSpan(row_block_begin_));
  p.blocks = staging_->Upload(batch.blocks);
  Launch(kernels::PagedAttention(p, stream()));
}

void CudaBackend::SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                        const PagePoolView& pool, Mat* out) {
  CHECK_EQ(batch.page_begin.size(), static_cast<size_t>(q.rows * batch.num_kv_heads + 1));
  CHECK_EQ(batch.pages.size(), batch.page_tokens.size());
  int32_t max_pages = 0;
  for (size_t i = 0; i + 1 < batch.page_begin.size(); ++i) {
    const int32_t n = batch.page_begin[i + 1] - batch.page_begin[i];
    CHECK_GE(n, 1) << "sparse attention list " << i << " has no pages";
    max_pages = std::max(max_pages, n);
  }
  for (int32_t t : batch.page_tokens) CHECK(t >= 1 && t <= pool.page_size) << "page tokens " << t;
  kernels::SparseAttentionParams p;
  p.common = AttentionFor(q, out, static_cast<int32_t>(q.rows), batch.num_heads, batch.num_kv_heads,
                          batch.scale, pool, max_pages);
  p.page_begin = staging_->Upload(batch.page_begin);
  p.pages = staging_->Upload(batch.pages);
  p.page_tokens = staging_->Upload(batch.page_tokens);
  Launch(kernels::SparseDecodeAttention(p, stream()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrFormat("model.device: cuda: no usable CUDA device (%s)",
                        e == cudaSuccess ? "none visible" : cudaGetErrorString(e)));
  }
  auto backend = std::make_unique<CudaBackend>();
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace specula
