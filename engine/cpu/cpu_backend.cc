#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/fault_injection.h"

namespace specula {
namespace {

constexpr size_t kAlignment = 64;
// Buffers this large (weights, the KV pool) are aligned to and advised as transparent huge
// pages: one fault per 2 MiB instead of per 4 KiB when first written (a model load touches every
// byte), and fewer TLB misses when a GEMV streams the weights.
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugePageMinBytes = 2 * kHugePage;

// Rows per parallel task so that each task has enough work to amortize the hand-off.
int64_t RowsPerTask(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

// Small products run on one thread: handing them to OpenBLAS's workers costs more than it saves,
// and an idle worker spins (sched_yield) for a while after every call, taking a core from the
// rest of the process. A product is worth the workers when its weights are big enough that
// streaming them is bandwidth-bound (GEMV at batch 1), or when it has enough arithmetic.
// Measured on the tiny model at 64 streams: 12.5K tok/s single-threaded vs 11.0K with two
// threads, at 1.56 instead of 1.85 cores (docs/BENCHMARKS.md).
constexpr int64_t kParallelWeightElements = int64_t{1} << 18;  // 1 MiB of fp32
constexpr int64_t kParallelMacs = int64_t{1} << 22;

// OpenBLAS's thread count is process-wide; remember the last setting to skip redundant calls.
std::atomic<int> blas_threads{-1};

void UseBlasThreads(int n) {
  if (blas_threads.exchange(n, std::memory_order_relaxed) != n) openblas_set_num_threads(n);
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

namespace {

// Physical memory, or the cgroup v2 limit of the container we run in when that is lower.
uint64_t UsableMemoryBytes() {
  uint64_t bytes =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  uint64_t limit = 0;
  if (cgroup >> limit && limit > 0) bytes = std::min(bytes, limit);  // "max" reads as no number
  return bytes;
}

}  // namespace

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  // With overcommit an allocation larger than the machine can succeed and fail later, page by
  // page, with the OOM killer; refuse it while the caller can still report it.
  static const uint64_t available = UsableMemoryBytes();
  if (bytes > available) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cpu backend: %d bytes requested, more than this machine's memory (%d bytes, or the "
        "container's limit)",
        bytes, available));
  }
  const size_t align = bytes >= kHugePageMinBytes ? kHugePage : kAlignment;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p != nullptr && align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // advice only
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cpu backend: cannot allocate %d bytes", bytes));
  }
  memory_->Add(p, bytes, MemoryKind::kDevice);
  return DeviceBuffer(p, bytes, [registry = memory_](void* q) {
    registry->Remove(q);
    std::free(q);
  });
}

absl::StatusOr<DeviceBuffer> CpuBackend::AllocatePinnedHost(size_t bytes) {
  absl::StatusOr<DeviceBuffer> mapped = MapHostMemory(bytes);
  if (!mapped.ok()) return mapped.status();
  // Registered as pinned host memory: device operations may read pages in it, but a DeviceSpan
  // of metadata must not point there (the plan's staging buffer is pinned host memory).
  void* data = mapped->data();
  memory_->Add(data, bytes, MemoryKind::kPinnedHost);
  auto holder = std::make_shared<DeviceBuffer>(std::move(*mapped));
  return DeviceBuffer(data, bytes, [registry = memory_, holder](void* q) mutable {
    registry->Remove(q);
    holder.reset();
  });
}

std::unique_ptr<Stream> CpuBackend::CreateStream() { return MakeCopyStream(nullptr); }

std::unique_ptr<Stream> CpuBackend::MakeCopyStream(std::function<void()> before_copy) {
  return std::make_unique<CpuCopyStream>(&counters_, std::move(before_copy));
}

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyToDeviceAsync(void* dst, const void* pinned_src, size_t bytes) {
  std::memcpy(dst, pinned_src, bytes);  // the compute stream runs at enqueue
}

void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  ++counters_.host_syncs;  // on a GPU the read waits for the compute stream
  ++counters_.host_reads;
  (void)SPECULA_FAULT(Fault::kSlowDevice);  // sleeps when armed
  if (SPECULA_FAULT(Fault::kDeviceLost)) {
    device_fault_ = absl::InternalError("the device failed: device lost (injected fault)");
  }
  std::memcpy(dst, src, bytes);
}

void CpuBackend::Memset(void* dst, int value, size_t bytes) { std::memset(dst, value, bytes); }

namespace {

class CpuWeightUploader : public WeightUploader {
 public:
  explicit CpuWeightUploader(CpuBackend& backend) : backend_(backend) {}
  absl::StatusOr<Weight> Upload(absl::Span<const WeightPart> parts, int64_t out,
                                int64_t in) override {
    return backend_.UploadWeightParts(parts, out, in);
  }

 private:
  CpuBackend& backend_;
};

}  // namespace

std::unique_ptr<WeightUploader> CpuBackend::CreateWeightUploader(size_t /*staging_bytes*/) {
  return std::make_unique<CpuWeightUploader>(*this);
}

absl::StatusOr<Weight> CpuBackend::UploadWeightParts(absl::Span<const WeightPart> parts,
                                                     int64_t out, int64_t in) {
  const int64_t n = out * in;
  CHECK_EQ(TotalElements(parts), n);
  auto buffer = Allocate(static_cast<size_t>(n) * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  float* dst = buffer->as<float>();
  // Several threads: converting is cheap, but first touches of the mapped file and of the new
  // buffer each cost a page fault, and those run in parallel.
  constexpr int64_t kMinChunk = int64_t{1} << 18;
  pool_.ParallelFor(n, kMinChunk, [&](int64_t begin, int64_t end) {
    ConvertWeightRange(parts, begin, end, DType::kF32, dst + begin);
  });
  Weight w;
  w.buffer = std::move(*buffer);
  w.dtype = DType::kF32;
  w.out = out;
  w.in = in;
  return w;
}

void CpuBackend::Gemm(const Mat& x, const Weight& w, const Weight& bias, Mat* y) {
  CHECK_EQ(x.cols, w.in);
  CHECK_EQ(y->cols, w.out);
  CHECK_EQ(x.rows, y->rows);
  if (x.rows == 0) return;
  const bool parallel =
      w.in * w.out >= kParallelWeightElements || x.rows * w.in * w.out >= kParallelMacs;
  UseBlasThreads(parallel ? pool_.num_threads() : 1);
  if (x.rows == 1) {  // batch-1 decode: GEMV streams the weights once, at memory bandwidth
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(w.out), static_cast<int>(w.in), 1.0f,
                w.buffer.as<float>(), static_cast<int>(w.in), x.data, 1, 0.0f, y->data, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(x.rows),
                static_cast<int>(w.out), static_cast<int>(w.in), 1.0f, x.data,
                static_cast<int>(x.stride), w.buffer.as<float>(), static_cast<int>(w.in), 0.0f,
                y->data, static_cast<int>(y->stride));
  }
  if (!bias.empty()) {
    const float* b = bias.buffer.as<float>();
    for (int64_t r = 0; r < y->rows; ++r) {
      float* row = y->row(r);
      for (int64_t c = 0; c < y->cols; ++c) row[c] += b[c];
    }
  }
}

void CpuBackend::RmsNorm(const Mat& x, const Weight& weight, float eps, Mat* y) {
  CHECK_EQ(x.cols, weight.in);
  const float* w = weight.buffer.as<float>();
  pool_.ParallelFor(x.rows, RowsPerTask(x.cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = x.row(r);
      float* o = y->row(r);
      double sum = 0.0;
      for (int64_t c = 0; c < x.cols; ++c) sum += static_cast<double>(in[c]) * in[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(sum / x.cols + eps));
      for (int64_t c = 0; c < x.cols; ++c) o[c] = in[c] * inv * w[c];
    }
  });
}

void CpuBackend::Rope(Mat* x, int32_t num_heads, int32_t head_dim,
                      DeviceSpan<const int32_t> position_span,
                      DeviceSpan<const float> inv_freq_span) {
  const absl::Span<const int32_t> positions = Host(position_span);
  const absl::Span<const float> inv_freq = Host(inv_freq_span);
  const int32_t half = head_dim / 2;
  CHECK_EQ(static_cast<int64_t>(positions.size()), x->rows);
  CHECK_EQ(static_cast<int32_t>(inv_freq.size()), half);
  pool_.ParallelFor(x->rows, 4, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> cos_t, sin_t;  // each thread's, kept across calls
    cos_t.resize(half);
    sin_t.resize(half);
    for (int64_t t = begin; t < end; ++t) {
      // The angle in double: fp32 products lose precision at long positions.
      for (int32_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) * inv_freq[i];
        cos_t[i] = static_cast<float>(std::cos(angle));
        sin_t[i] = static_cast<float>(std::sin(angle));
      }
      float* row = x->row(t);
      for (int32_t h = 0; h < num_heads; ++h) {
        float* v = row + static_cast<int64_t>(h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_t[i] - b * sin_t[i];
          v[i + half] = b * cos_t[i] + a * sin_t[i];
        }
      }
    }
  });
}

void CpuBackend::SwiGlu(const Mat& gate_up, Mat* out) {
  const int64_t n = out->cols;
  CHECK_EQ(gate_up.cols, 2 * n);
  pool_.ParallelFor(out->rows, RowsPerTask(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate_up.row(r);
      const float* u = g + n;
      float* o = out->row(r);
      for (int64_t c = 0; c < n; ++c) o[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
    }
  });
}

void CpuBackend::Embed(DeviceSpan<const int32_t> id_span, const Weight& table, Mat* out) {
  const absl::Span<const int32_t> ids = Host(id_span);
  CHECK_EQ(out->cols, table.in);
  const float* t = table.buffer.as<float>();
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] >= 0 && ids[i] < table.out) << "token id " << ids[i];
    std::memcpy(out->row(static_cast<int64_t>(i)), t + static_cast<int64_t>(ids[i]) * table.in,
                table.in * sizeof(float));
  }
}

void CpuBackend::Add(Mat* x, const Mat& y) {
  for (int64_t r = 0; r < x->rows; ++r) {
    float* a = x->row(r);
    const float* b = y.row(r);
    for (int64_t c = 0; c < x->cols; ++c) a[c] += b[c];
  }
}

void CpuBackend::GatherRows(const Mat& src, DeviceSpan<const int32_t> row_span, Mat* out) {
  const absl::Span<const int32_t> rows = Host(row_span);
  CHECK_EQ(src.cols, out->cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < src.rows);
    std::memcpy(out->row(static_cast<int64_t>(i)), src.row(rows[i]), src.cols * sizeof(float));
  }
}

void CpuBackend::MaskLogits(const Mat& logits, DeviceSpan<const int32_t> row_span,
                            DeviceSpan<const uint32_t> bit_span) {
  const absl::Span<const int32_t> rows = Host(row_span);
  const absl::Span<const uint32_t> bits = Host(bit_span);
  const int64_t words = (logits.cols + 31) / 32;
  CHECK_EQ(static_cast<int64_t>(bits.size()), static_cast<int64_t>(rows.size()) * words);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < logits.rows);
    MaskRow(absl::MakeSpan(logits.row(rows[i]), logits.cols),
            bits.data() + static_cast<int64_t>(i) * words);
  }
}

void CpuBackend::SampleRows(const Mat& logits, DeviceSpan<const RowSampling> row_span,
                            DeviceSpan<SampledRow> out_span) {
  const absl::Span<const RowSampling> rows = Host(row_span);
  const absl::Span<SampledRow> out = Host(out_span);
  CHECK_EQ(static_cast<int64_t>(rows.size()), logits.rows);
  CHECK_EQ(out.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t row = static_cast<int64_t>(r);
    out[r] = row_sampler_.Sample(rows[r], absl::MakeConstSpan(logits.row(row), logits.cols));
  }
}

}  // namespace specula
