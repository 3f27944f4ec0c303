#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_backend_impl.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_stream.h"
#include "engine/cuda/cuda_weight_uploader.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/few_row_gemm.h"
#include "kernels/kv_write.h"
#include "kernels/launch_policy.h"
#include "kernels/prefill_attention.h"
#include "kernels/sampling.h"
#include "kernels/skinny_gemm.h"
#include "kernels/sparse.h"

namespace specula {
namespace cuda_internal {
namespace {

// Split-K workspace of the attention kernels: 64 MiB covers 256 rows x 64 heads x 7 splits at
// head_dim 128 (fewer splits are used when it does not fit).
constexpr size_t kAttentionScratchBytes = size_t{64} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

kernels::Rows ToRows(const Mat& m) { return {m.data, m.rows, m.cols, m.stride}; }

absl::Status AllocationError(const char* what, size_t bytes, cudaError_t e) {
  cudaGetLastError();  // an allocation failure is not sticky; clear it
  return absl::ResourceExhaustedError(absl::StrFormat(
      "cuda backend: cannot allocate %d bytes of %s: %s", bytes, what, cudaGetErrorString(e)));
}

}  // namespace

void CheckLaunch(cudaError_t e, const char* what) {
  CHECK(e == cudaSuccess) << "cuda kernel " << what << ": " << cudaGetErrorName(e) << " ("
                          << cudaGetErrorString(e) << ")";
}

CudaBackend::~CudaBackend() {
  // Unchecked: at process exit the CUDA runtime may already be unloading.
  if (compute_ != nullptr) cudaStreamSynchronize(stream());
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

absl::Status CudaBackend::Init() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  compute_ = std::make_unique<CudaStream>(&counters_.host_syncs);
  if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) {
    cublas_ = nullptr;
    return absl::FailedPreconditionError("model.device: cuda: cuBLAS did not initialize");
  }
  CUBLAS_CHECK(cublasSetStream(cublas_, stream()));
  // After SetStream, which resets it: cuBLAS's own default would be allocated on first use,
  // which a CUDA graph recording cannot do. 32 MiB is what cuBLAS recommends for Hopper.
  ASSIGN_OR_RETURN(cublas_workspace_, Allocate(kCublasWorkspaceBytes));
  CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.bytes()));
  ASSIGN_OR_RETURN(attention_scratch_, Allocate(kAttentionScratchBytes));
  max_cache_slots_ = kernels::MaxSelectCacheSlots();
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess) return AllocationError("device memory", bytes, e);
  return DeviceBuffer(p, bytes, [](void* q) { cudaFree(q); });
}

// Page-locked and mapped: copy engines read it at full PCIe bandwidth, and kernels read it
// through the same address (unified addressing): the host store's pages, the plan's staging.
absl::StatusOr<DeviceBuffer> CudaBackend::AllocatePinnedHost(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e =
      cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) return AllocationError("pinned host memory", bytes, e);
  return DeviceBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
}

void CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  // The source may be reused once this returns: wait for the copy. Not a counted sync (the CPU
  // backend counts none here either): it uploads weights and state, never inside a step.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::CopyToDeviceAsync(void* dst, const void* pinned_src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream()));
}

void CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  ++counters_.host_reads;
  ++counters_.host_syncs;
  // Where a kernel's fault surfaces (the step's readback): kept as the device fault, for the
  // engine to fail its requests and the server to take its fatal path, instead of aborting.
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream());
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream());
  if (e != cudaSuccess && device_fault_.ok()) {
    device_fault_ = absl::InternalError(absl::StrFormat(
        "the device failed: CUDA error %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e)));
  }
}

void CudaBackend::Memset(void* dst, int value, size_t bytes) {
  CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream()));
}

namespace {

kernels::RmsNormParams NormParams(const Mat& x, const Weight& weight, float eps, Mat* y) {
  CHECK_EQ(x.cols, weight.in);
  CHECK(weight.dtype == DType::kF32) << "norm weights are kept in fp32";
  kernels::RmsNormParams p;
  p.x = ToRows(x);
  p.y = ToRows(*y);
  p.weight = weight.buffer.as<float>();
  p.eps = eps;
  return p;
}

}  // namespace

void CudaBackend::RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) {
  CheckLaunch(kernels::RmsNorm(NormParams(x, weight, eps, y), stream()), "RmsNorm");
}

void CudaBackend::AddRmsNorm(Mat* x, const Mat& residual, const Weight& weight, float eps, Mat* y) {
  CHECK_EQ(x->rows, residual.rows);
  CHECK_EQ(x->cols, residual.cols);
  kernels::RmsNormParams p = NormParams(*x, weight, eps, y);
  p.residual = ToRows(residual);
  CheckLaunch(kernels::RmsNorm(p, stream()), "AddRmsNorm");
}

void CudaBackend::HeadRmsNorm(Mat* x, int32_t num_heads, int32_t head_dim, const Weight& weight,
                              float eps) {
  CHECK_EQ(x->cols, static_cast<int64_t>(num_heads) * head_dim);
  Mat vectors(x->data, x->rows, head_dim, x->stride);
  kernels::RmsNormParams p = NormParams(vectors, weight, eps, &vectors);
  p.heads = num_heads;
  CheckLaunch(kernels::RmsNorm(p, stream()), "HeadRmsNorm");
}

void CudaBackend::Rope(Mat* x, int32_t num_heads, int32_t head_dim,
                       DeviceSpan<const int32_t> positions, DeviceSpan<const float> inv_freq) {
  CHECK_EQ(static_cast<int64_t>(positions.size()), x->rows);
  CHECK_EQ(static_cast<int32_t>(inv_freq.size()), head_dim / 2);
  kernels::RopeParams p;
  p.x = ToRows(*x);
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.positions = positions.data();
  p.inv_freq = inv_freq.data();
  CheckLaunch(kernels::Rope(p, stream()), "Rope");
}

void CudaBackend::SwiGlu(const Mat& gate_up, Mat* out) {
  CHECK_EQ(gate_up.cols, 2 * out->cols);
  CheckLaunch(kernels::SwiGlu({ToRows(gate_up), ToRows(*out)}, stream()), "SwiGlu");
}

void CudaBackend::Embed(DeviceSpan<const int32_t> ids, const Weight& table, Mat* out) {
  CHECK_EQ(out->cols, table.in);
  CHECK_EQ(static_cast<int64_t>(ids.size()), out->rows);
  kernels::EmbedParams p;
  p.ids = ids.data();
  p.table = table.buffer.data();
  p.table_dtype = table.dtype;
  p.vocab = table.out;
  p.out = ToRows(*out);
  CheckLaunch(kernels::Embed(p, stream()), "Embed");
}

void CudaBackend::Add(Mat* x, const Mat& y) {
  CheckLaunch(kernels::Add({ToRows(*x), ToRows(y)}, stream()), "Add");
}

void CudaBackend::GatherRows(const Mat& src, DeviceSpan<const int32_t> rows, Mat* out) {
  CHECK_EQ(src.cols, out->cols);
  CHECK_EQ(static_cast<int64_t>(rows.size()), out->rows);
  CheckLaunch(kernels::GatherRows({ToRows(src), rows.data(), ToRows(*out)}, stream()),
              "GatherRows");
}

void CudaBackend::SampleRows(const Mat& logits, DeviceSpan<const RowSampling> rows,
                             DeviceSpan<SampledRow> out) {
  CHECK_EQ(static_cast<int64_t>(rows.size()), logits.rows);
  CHECK_EQ(out.size(), rows.size());
  kernels::SampleRowsParams p;
  p.logits = logits.data;
  p.rows = logits.rows;
  p.vocab = logits.cols;
  p.stride = logits.stride;
  p.sampling = rows.data();
  p.out = out.data();
  CheckLaunch(kernels::SampleRows(p, stream()), "SampleRows");
}

void CudaBackend::MaskLogits(const Mat& logits, DeviceSpan<const int32_t> rows,
                             DeviceSpan<const uint32_t> bits) {
  CHECK_EQ(static_cast<int64_t>(bits.size()),
           static_cast<int64_t>(rows.size()) * ((logits.cols + 31) / 32));
  kernels::MaskLogitsParams p;
  p.logits = logits.data;
  p.vocab = logits.cols;
  p.stride = logits.stride;
  p.rows = rows.data();
  p.masked_rows = static_cast<int64_t>(rows.size());
  p.bits = bits.data();
  CheckLaunch(kernels::MaskLogits(p, stream()), "MaskLogits");
}

void CudaBackend::WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
                          const KvLayerView& layer) {
  CHECK(static_cast<int64_t>(where.blocks.size()) >= k.rows &&
        static_cast<int64_t>(where.offsets.size()) >= k.rows);
  kernels::KvWriteParams p;
  p.k = ToRows(k);
  p.v = ToRows(v);
  p.blocks = where.blocks.data();
  p.offsets = where.offsets.data();
  p.base = layer.base;
  p.dtype = layer.dtype;
  p.num_kv_heads = layer.num_kv_heads;
  p.page_size = layer.page_size;
  p.head_dim = layer.head_dim;
  CheckLaunch(kernels::WriteKv(p, stream()), "WriteKv");
}

std::unique_ptr<WeightUploader> CudaBackend::CreateWeightUploader(size_t staging_bytes) {
  return std::make_unique<CudaWeightUploader>([this](size_t bytes) { return Allocate(bytes); },
                                              stream(), staging_bytes);
}

void CudaBackend::Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) {
  CHECK_EQ(x.cols, w.in);
  CHECK_EQ(y->cols, w.out);
  CHECK_EQ(x.rows, y->rows);
  CHECK(w.dtype == DType::kBF16) << "GEMM weights are bf16 on the CUDA backend";
  if (x.rows == 0) return;
  CHECK(bias.empty() || bias.dtype == DType::kF32);
  const float* bias_data = bias.empty() ? nullptr : bias.buffer.as<float>();
  if (GemmOneRow(x, w, bias_data, y)) return;
  const void* x_bf16 = Bf16GemmInput(x);
  if (GemmFewRows(x_bf16, w, bias_data, y)) return;
  // Row-major y [m, out] is column-major yᵀ [out, m]: yᵀ = W · xᵀ, with W row-major [out, in]
  // read as column-major [in, out] and transposed.
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.out),
                            static_cast<int>(x.rows), static_cast<int>(w.in), &alpha,
                            w.buffer.data(), CUDA_R_16BF, static_cast<int>(w.in), x_bf16,
                            CUDA_R_16BF, static_cast<int>(x.cols), &beta, y->data, CUDA_R_32F,
                            static_cast<int>(y->stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias_data != nullptr) {
    CheckLaunch(kernels::AddBias({ToRows(*y), bias_data}, stream()), "AddBias");
  }
}

// Batch-1 decode: the bandwidth-bound kernel, fp32 x read as it is, bias added in it.
bool CudaBackend::GemmOneRow(const Mat& x, const Weight& w, const float* bias, Mat* y) {
  kernels::SkinnyGemmParams p;
  p.x = x.data;
  p.w = w.buffer.data();
  p.bias = bias;
  p.y = y->data;
  p.m = static_cast<int32_t>(x.rows);
  p.in = static_cast<int32_t>(w.in);
  p.out = static_cast<int32_t>(w.out);
  if (!kernels::SkinnyGemmSupports(p)) return false;
  CheckLaunch(kernels::SkinnyGemm(p, stream()), "SkinnyGemm");
  return true;
}

const void* CudaBackend::Bf16GemmInput(const Mat& x) {
  const size_t input_bytes = static_cast<size_t>(x.rows) * x.cols * sizeof(uint16_t);
  if (gemm_input_.bytes() < input_bytes) {
    // Freeing the old buffer (cudaFree) waits for the kernels that read it; a batch larger than
    // any before costs that once.
    auto grown = Allocate(input_bytes);
    CHECK(grown.ok()) << grown.status();
    gemm_input_ = std::move(*grown);
    ++memory_generation_;
  }
  CheckLaunch(kernels::ToBf16({ToRows(x), gemm_input_.data()}, stream()), "ToBf16");
  return gemm_input_.data();
}

// Decode of 2-16 sequences: the tensor-core kernel that shares each weight load among the rows,
// bias added in it.
bool CudaBackend::GemmFewRows(const void* x_bf16, const Weight& w, const float* bias, Mat* y) {
  kernels::FewRowGemmParams p;
  p.x = x_bf16;
  p.w = w.buffer.data();
  p.bias = bias;
  p.y = y->data;
  p.y_stride = y->stride;
  p.m = static_cast<int32_t>(y->rows);
  p.in = static_cast<int32_t>(w.in);
  p.out = static_cast<int32_t>(w.out);
  p.sm_count = sm_count_;
  if (!kernels::FewRowGemmSupports(p)) return false;
  CheckLaunch(kernels::FewRowGemm(p, stream()), "FewRowGemm");
  return true;
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

namespace {

// Prefill chunks go to the tensor-core tile kernel when a sequence has enough rows to fill part
// of a 64-row tile; decode rows and short chunks to the row kernel, which splits long lists
// across the GPU and keeps Q and the softmax weights in fp32.
constexpr int32_t kTileKernelMinRows = 16;

bool UseTileKernel(const AttentionBatch& batch, const KvLayerView& layer) {
  return batch.seqs > 0 && batch.max_seq_rows >= kTileKernelMinRows &&
         kernels::PrefillAttentionSupports(layer.dtype, layer.head_dim);
}

}  // namespace

// A batch with prefill chunks on the tensor-core tile kernel (kernels/prefill_attention.h).
void CudaBackend::TileAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                                Mat* out) {
  kernels::PrefillAttentionLaunch launch;
  kernels::PrefillAttentionParams& p = launch.params;
  p.q = q.data;
  p.q_stride = q.stride;
  p.out = out->data;
  p.out_stride = out->stride;
  p.num_heads = batch.num_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.page_size = layer.page_size;
  p.scale = batch.scale;
  p.kv_base = layer.base;
  p.dtype = layer.dtype;
  p.row_keys = batch.row_keys.data();
  p.row_block_begin = batch.row_block_begin.data();
  p.blocks = batch.blocks.data();
  p.seq_rows = batch.seq_rows.data();
  p.seqs = batch.seqs;
  p.max_seq_rows = batch.max_seq_rows;
  p.sm_count = sm_count_;
  p.rows = batch.rows;
  p.scratch = attention_scratch_.as<float>();
  launch.max_keys = batch.max_keys;
  launch.scratch_floats = attention_scratch_.bytes() / sizeof(float);
  CheckLaunch(kernels::PrefillAttention(launch, stream()), "PrefillAttention");
}

void CudaBackend::PagedAttention(const Mat& q, const AttentionBatch& batch,
                                 const KvLayerView& layer, Mat* out) {
  if (batch.rows == 0) return;
  const Mat rows_q = q.Rows(batch.first_row, batch.rows);
  Mat rows_out = out->Rows(batch.first_row, batch.rows);
  if (UseTileKernel(batch, layer)) {
    TileAttention(rows_q, batch, layer, &rows_out);
    return;
  }
  kernels::PagedAttentionParams p;
  p.common =
      AttentionFor(rows_q, &rows_out, batch.rows, batch.num_heads, layer.num_kv_heads, batch.scale,
                   PagesOf(layer), static_cast<int32_t>(CeilDiv(batch.max_keys, layer.page_size)));
  p.row_keys = batch.row_keys.data();
  p.row_block_begin = batch.row_block_begin.data();
  p.blocks = batch.blocks.data();
  CheckLaunch(kernels::PagedAttention(p, stream()), "PagedAttention");
}

void CudaBackend::SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                        const PagePoolView& device_pool,
                                        const PagePoolView& host_pool, Mat* out) {
  if (batch.rows == 0) return;
  CHECK(host_pool.base == nullptr ||
        (host_pool.dtype == device_pool.dtype && host_pool.page_size == device_pool.page_size &&
         host_pool.head_dim == device_pool.head_dim))
      << "the host and device page pools must have the same page layout";
  const Mat rows_q = q.Rows(batch.first_row, batch.rows);
  Mat rows_out = out->Rows(batch.first_row, batch.rows);
  kernels::SparseAttentionParams p;
  p.common = AttentionFor(rows_q, &rows_out, batch.rows, batch.num_heads, batch.num_kv_heads,
                          batch.scale, device_pool, batch.max_pages);
  p.list_begin = batch.list_begin.data();
  p.list_count = batch.list_count.data();
  p.pages = batch.pages.data();
  p.page_tokens = batch.page_tokens.data();
  p.host_base = host_pool.base;
  CheckLaunch(kernels::SparseDecodeAttention(p, stream()), "SparseDecodeAttention");
}

}  // namespace cuda_internal

absl::Status CudaDeviceVisible() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return absl::OkStatus();
  cudaGetLastError();
  return absl::FailedPreconditionError(absl::StrFormat(
      "no usable CUDA device (%s)", e == cudaSuccess ? "none visible" : cudaGetErrorString(e)));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(bool dependent_launches) {
  if (absl::Status visible = CudaDeviceVisible(); !visible.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("model.device: cuda: ", visible.message()));
  }
  kernels::SetDependentLaunches(dependent_launches);
  auto backend = std::make_unique<cuda_internal::CudaBackend>();
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace specula
