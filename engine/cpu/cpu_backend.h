// The reference backend: fp32 weights and activations, KV pages in fp32, bf16 or f16 (stored
// rounded, computed in fp32), GEMMs through CBLAS (OpenBLAS), the rest as plain loops spread over
// a thread pool. Every CUDA kernel is tested against these semantics.
//
// It keeps a GPU's rules where a CPU would let them slide, so the CPU tests catch what would
// break on a GPU: DeviceSpans must point into memory this backend allocated (MemoryRegistry);
// copy streams run on their own threads, so events really order work; the sparse operations'
// slot states are atomics shared with the copy streams, as on the device.
#pragma once

#include <functional>
#include <memory>

#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/common/check.h"
#include "engine/common/thread_pool.h"
#include "engine/cpu/cpu_stream.h"
#include "engine/cpu/memory_registry.h"
#include "engine/sampling/row_sampling.h"

namespace specula {

class CpuBackend : public Backend {
 public:
  // `num_threads` 0 = all cores.
  explicit CpuBackend(int num_threads = 0);

  std::string name() const override { return "cpu"; }
  bool memory_is_host_readable() const override { return true; }
  // fp32, so CPU results stay comparable with an fp32 reference.
  DType default_kv_dtype() const override { return DType::kF32; }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  // Lazily committed anonymous memory (MapHostMemory): nothing to pin on the CPU.
  absl::StatusOr<DeviceBuffer> AllocatePinnedHost(size_t bytes) override;
  void CopyToDevice(void* dst, const void* src, size_t bytes) override;
  void CopyToDeviceAsync(void* dst, const void* pinned_src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Memset(void* dst, int value, size_t bytes) override;
  Stream& compute_stream() override { return compute_; }
  std::unique_ptr<Stream> CreateStream() override;
  // Weights are fp32, converted from the parts straight into their buffer by the thread pool.
  std::unique_ptr<WeightUploader> CreateWeightUploader(size_t staging_bytes) override;
  absl::StatusOr<Weight> UploadWeightParts(absl::Span<const WeightPart> parts, int64_t out,
                                           int64_t in);

  void Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) override;
  void RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) override;
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

  void ScorePages(const Mat& q, const SparseScoreArgs& args) override;
  void SelectPages(const SparseSelectArgs& args) override;
  void RetireWindowPages(const SparseRetireArgs& args) override;
  void CompletePages(const SparseCompleteArgs& args) override;
  void SummarizePages(const PageSummaryArgs& args) override;
  void GatherPages(Stream& stream, const PageGatherArgs& args) override;

  // The reference: engine/sampling/row_sampling.h, one row after another.
  void SampleRows(const Mat& logits, DeviceSpan<const RowSampling> rows,
                  DeviceSpan<SampledRow> out) override;
  void MaskLogits(const Mat& logits, DeviceSpan<const int32_t> rows,
                  DeviceSpan<const uint32_t> bits) override;

  // The host view of a DeviceSpan: CHECK-fails unless it lies inside memory from Allocate (what
  // a device operation may dereference on a GPU).
  template <typename T>
  absl::Span<T> Host(DeviceSpan<T> span) const {
    CHECK(memory_->Contains(span.data(), span.bytes(), MemoryKind::kDevice))
        << "cpu backend: a DeviceSpan of " << span.size() << " elements at " << span.data()
        << " is not backend memory (a host pointer handed to a device operation?)";
    return absl::Span<T>(span.data(), span.size());
  }

 protected:
  // A copy stream counting into this backend's counters; `before_copy` as CpuCopyStream takes it.
  std::unique_ptr<Stream> MakeCopyStream(std::function<void()> before_copy);

 private:
  ThreadPool pool_;
  std::shared_ptr<MemoryRegistry> memory_ = std::make_shared<MemoryRegistry>();
  CpuComputeStream compute_{&counters_};
  RowSampler row_sampler_;  // SampleRows' scratch
};

}  // namespace specula
