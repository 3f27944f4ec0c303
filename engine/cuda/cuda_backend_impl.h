// The CUDA backend's class, shared by its two sources: cuda_backend.cc (memory, streams, the
// forward pass) and cuda_sparse.cc (the sparse KV operations). Internal to engine/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/cuda/cuda_stream.h"
#include "kernels/attention.h"

namespace specula::cuda_internal {

class CudaBackend : public Backend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override;

  // The streams, cuBLAS and the workspaces, on the current device.
  absl::Status Init();

  std::string name() const override { return "cuda"; }
  bool memory_is_host_readable() const override { return false; }
  DType default_kv_dtype() const override { return DType::kBF16; }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToDeviceAsync(void* dst, const void* pinned_src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Memset(void* dst, int value, size_t bytes) override;
  Stream& compute_stream() override { return *compute_; }
  std::unique_ptr<Stream> CreateStream() override {
    return std::make_unique<CudaStream>(&counters_.host_syncs);
  }

  std::unique_ptr<WeightUploader> CreateWeightUploader(size_t staging_bytes) override;
  void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) override;
  void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) override;
  void AddRmsNorm(Mat* x, const Mat& residual, const Weight& weight, float eps, Mat* y) override;
  void HeadRmsNorm(Mat* x, int32_t num_heads, int32_t head_dim, const Weight& weight,
                   float eps) override;
  void Rope(Mat* x, int32_t num_heads, int32_t head_dim, DeviceSpan<const int32_t> positions,
            DeviceSpan<const float> inv_freq) override;
  void SwiGlu(const Mat& gate_up, Mat* out) override;
  void Embed(DeviceSpan<const int32_t> ids, const Weight& table, Mat* out) override;
  void Add(Mat* x, const Mat& y) override;
  void GatherRows(const Mat& src, DeviceSpan<const int32_t> rows, Mat* out) override;
  void WriteKv(const Mat& k, const Mat& v, const KvWrite& where, const KvLayerView& layer) override;
  void PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                      Mat* out) override;
  void SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                             const PagePoolView& device_pool, const PagePoolView& host_pool,
                             Mat* out) override;

  // cuda_sparse.cc
  void ScorePages(const Mat& q, const SparseScoreArgs& args) override;
  void SelectPages(const SparseSelectArgs& args) override;
  void RetireWindowPages(const SparseRetireArgs& args) override;
  void CompletePages(const SparseCompleteArgs& args) override;
  void SummarizePages(const PageSummaryArgs& args) override;
  void GatherPages(Stream& stream, const PageGatherArgs& args) override;
  void SampleRows(const Mat& logits, DeviceSpan<const RowSampling> rows,
                  DeviceSpan<SampledRow> out) override;
  void MaskLogits(const Mat& logits, DeviceSpan<const int32_t> rows,
                  DeviceSpan<const uint32_t> bits) override;
  int32_t max_sparse_cache_slots() const override { return max_cache_slots_; }
  // cuda_record.cc
  bool can_record() const override { return true; }
  std::unique_ptr<RecordedOps> Record(absl::FunctionRef<void()> enqueue) override;
  // Counts reallocations of the backend's own buffers that operations point into (the GEMM
  // input): recorded operations from before one must not replay.
  uint64_t memory_generation() const { return memory_generation_; }

 private:
  cudaStream_t stream() const { return compute_->raw(); }
  // Gemm's kernels by row count: one row (fp32 x), 2-16 rows (bf16 x), else cuBLAS. Each of the
  // first two returns false, launching nothing, for a shape it does not serve.
  bool GemmOneRow(const Mat& x, const Weight& w, const float* bias, Mat* y);
  bool GemmFewRows(const void* x_bf16, const Weight& w, const float* bias, Mat* y);
  // x converted to bf16 in gemm_input_ (grown to fit), packed rows of x.cols.
  const void* Bf16GemmInput(const Mat& x);
  // PagedAttention of a batch with prefill chunks, on the tensor-core tile kernel.
  void TileAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer, Mat* out);
  // The kernels' common parameters: `rows` rows of q and out, over pages of `pool`.
  kernels::AttentionCommon AttentionFor(const Mat& q, Mat* out, int32_t rows, int32_t num_heads,
                                        int32_t num_kv_heads, float scale, const PagePoolView& pool,
                                        int32_t max_pages) const;

  int sm_count_ = 1;
  int32_t max_cache_slots_ = 0;  // kernels::MaxSelectCacheSlots() on this device
  std::unique_ptr<CudaStream> compute_;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer gemm_input_;  // x in bf16 for GEMMs of 2+ rows, grown to the largest input
  uint64_t memory_generation_ = 0;
  DeviceBuffer attention_scratch_;
  DeviceBuffer cublas_workspace_;  // set explicitly, so recording a GEMM never allocates
};

// A failed launch or kernel leaves the context unusable: fatal (cuda_check.h).
void CheckLaunch(cudaError_t e, const char* what);

}  // namespace specula::cuda_internal
