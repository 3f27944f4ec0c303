// The reference backend: fp32 weights and activations, KV pages in fp32, bf16 or f16 (stored
// rounded, computed in fp32), GEMMs through CBLAS (OpenBLAS), the rest as plain loops
// spread over a thread pool. Every CUDA kernel is tested against these semantics.
#pragma once

#include <memory>

#include "engine/backend.h"
#include "engine/common/thread_pool.h"
#include "engine/cpu/cpu_stream.h"

namespace specula {

class CpuBackend : public Backend {
 public:
  // `num_threads` 0 = all cores.
  explicit CpuBackend(int num_threads = 0);

  std::string name() const override { return "cpu"; }
  // fp32, so CPU results stay comparable with an fp32 reference.
  DType default_kv_dtype() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  // Lazily committed anonymous memory (MapHostMemory): nothing to pin on the CPU.
  absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  Stream& compute_stream() override { return compute_; }
  std::unique_ptr<Stream> CreateStream() override;
  absl::StatusOr<Weight> UploadWeight(const float* data, int64_t out, int64_t in) override;

  void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) override;
  void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) override;
  void Rope(Mat* x, int32_t num_heads, int32_t head_dim, absl::Span<const int32_t> positions,
            absl::Span<const float> inv_freq) override;
  void SwiGlu(const Mat& gate_up, Mat* out) override;
  void Embed(absl::Span<const int32_t> ids, const Weight& table, Mat* out) override;
  void Add(Mat* x, const Mat& y) override;
  void GatherRows(const Mat& src, absl::Span<const int32_t> rows, Mat* out) override;
  void WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
               const KvLayerView& layer) override;
  void PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                      Mat* out) override;
  void SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                             const PagePoolView& pool, Mat* out) override;

 private:
  template <typename T>
  void PagedAttentionTyped(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                           const T* base, Mat* out);
  template <typename T>
  void SparseDecodeAttentionTyped(const Mat& q, const SparseAttentionBatch& batch,
                                  const PagePoolView& pool, const T* base, Mat* out);

  ThreadPool pool_;
  CpuComputeStream compute_{&counters_};
};

}  // namespace specula
