#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
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

namespace specula {
namespace {

constexpr size_t kAlignment = 64;

// Rows per parallel task so that each task has enough work to amortize the hand-off.
int64_t RowsPerTask(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)); }

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
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cpu backend: cannot allocate %d bytes", bytes));
  }
  return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
}

absl::StatusOr<DeviceBuffer> CpuBackend::AllocatePinnedHost(size_t bytes) {
  return MapHostMemory(bytes);
}

std::unique_ptr<Stream> CpuBackend::CreateStream() { return std::make_unique<CpuCopyStream>(); }

void CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  ++counters_.compute_syncs;  // on a GPU the read waits for the compute stream
  ++counters_.host_reads;
  std::memcpy(dst, src, bytes);
}

absl::StatusOr<Weight> CpuBackend::UploadWeight(const float* data, int64_t out, int64_t in) {
  const size_t bytes = static_cast<size_t>(out) * in * sizeof(float);
  auto buffer = Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  std::memcpy(buffer->data(), data, bytes);
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
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(w.out), static_cast<int>(w.in),
                1.0f, w.buffer.as<float>(), static_cast<int>(w.in), x.data, 1, 0.0f, y->data, 1);
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
                      absl::Span<const int32_t> positions, absl::Span<const float> inv_freq) {
  const int32_t half = head_dim / 2;
  CHECK_EQ(static_cast<int64_t>(positions.size()), x->rows);
  CHECK_EQ(static_cast<int32_t>(inv_freq.size()), half);
  pool_.ParallelFor(x->rows, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_t(half), sin_t(half);
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

void CpuBackend::Embed(absl::Span<const int32_t> ids, const Weight& table, Mat* out) {
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

void CpuBackend::GatherRows(const Mat& src, absl::Span<const int32_t> rows, Mat* out) {
  CHECK_EQ(src.cols, out->cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < src.rows);
    std::memcpy(out->row(static_cast<int64_t>(i)), src.row(rows[i]), src.cols * sizeof(float));
  }
}

namespace {

// Stores rows of fp32 K and V into pages of element type T (rounded to nearest even).
template <typename T>
void WriteKvTyped(const Mat& k, const Mat& v, const KvWrite& where, const KvLayerView& layer) {
  const int32_t hd = layer.head_dim;
  auto* base = static_cast<T*>(layer.base);
  for (int64_t t = 0; t < k.rows; ++t) {
    for (int32_t h = 0; h < layer.num_kv_heads; ++h) {
      T* page = base + (static_cast<size_t>(where.blocks[t]) * layer.num_kv_heads + h) *
                           layer.page_elems();
      T* k_dst = page + static_cast<int64_t>(where.offsets[t]) * hd;
      T* v_dst = page + (static_cast<int64_t>(layer.page_size) + where.offsets[t]) * hd;
      const float* k_src = k.row(t) + static_cast<int64_t>(h) * hd;
      const float* v_src = v.row(t) + static_cast<int64_t>(h) * hd;
      for (int32_t c = 0; c < hd; ++c) {
        k_dst[c] = FromF32<T>(k_src[c]);
        v_dst[c] = FromF32<T>(v_src[c]);
      }
    }
  }
}

// Softmax attention of one query head over n keys, visited in order: key(j) and value(j) give
// row j's K and V (of element type T, read as fp32). Shared by the dense and sparse paths so
// that, given the same keys in the same order, they compute bit-identical results.
template <typename KeyFn, typename ValueFn>
void AttendOneHead(const float* qv, int32_t n, int32_t hd, float scale, KeyFn key, ValueFn value,
                   std::vector<float>* scores, std::vector<float>* acc, float* out) {
  scores->resize(n);
  float max_score = -INFINITY;
  for (int32_t j = 0; j < n; ++j) {
    const auto* k = key(j);
    float dot = 0.0f;
    for (int32_t c = 0; c < hd; ++c) dot += qv[c] * ToF32(k[c]);
    (*scores)[j] = dot * scale;
    max_score = std::max(max_score, (*scores)[j]);
  }
  double denom = 0.0;
  acc->assign(hd, 0.0f);
  for (int32_t j = 0; j < n; ++j) {
    const float p = std::exp((*scores)[j] - max_score);
    denom += p;
    const auto* v = value(j);
    for (int32_t c = 0; c < hd; ++c) (*acc)[c] += p * ToF32(v[c]);
  }
  const float inv = static_cast<float>(1.0 / denom);
  for (int32_t c = 0; c < hd; ++c) out[c] = (*acc)[c] * inv;
}

}  // namespace

void CpuBackend::WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
                         const KvLayerView& layer) {
  VisitDType(layer.dtype, [&](auto tag) { WriteKvTyped<decltype(tag)>(k, v, where, layer); });
}

void CpuBackend::PagedAttention(const Mat& q, const AttentionBatch& batch,
                                const KvLayerView& layer, Mat* out) {
  VisitDType(layer.dtype, [&](auto tag) {
    PagedAttentionTyped(q, batch, layer, static_cast<const decltype(tag)*>(layer.base), out);
  });
}

template <typename T>
void CpuBackend::PagedAttentionTyped(const Mat& q, const AttentionBatch& batch,
                                     const KvLayerView& layer, const T* base, Mat* out) {
  const int32_t hd = layer.head_dim;
  const int32_t heads = batch.num_heads;
  const int32_t group = heads / layer.num_kv_heads;
  const int32_t ps = layer.page_size;

  // One task per (query row, head): rows of all sequences laid end to end.
  struct Task {
    int32_t seq;
    int32_t row;  // within the sequence
  };
  std::vector<Task> tasks;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.seqs.size()); ++s) {
    for (int32_t i = 0; i < batch.seqs[s].q_len; ++i) tasks.push_back({s, i});
  }
  const int64_t n_tasks = static_cast<int64_t>(tasks.size()) * heads;
  pool_.ParallelFor(n_tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(hd);
    for (int64_t task = begin; task < end; ++task) {
      const Task& tk = tasks[task / heads];
      const int32_t h = static_cast<int32_t>(task % heads);
      const int32_t kv_h = h / group;
      const AttentionSeq& seq = batch.seqs[tk.seq];
      const int32_t n_keys = seq.kv_len - seq.q_len + tk.row + 1;
      const int32_t* blocks = batch.blocks.data() + seq.block_begin;
      auto page = [&](int32_t j) {
        return base + (static_cast<size_t>(blocks[j / ps]) * layer.num_kv_heads + kv_h) *
                          layer.page_elems();
      };
      AttendOneHead(
          q.row(seq.q_begin + tk.row) + static_cast<int64_t>(h) * hd, n_keys, hd, batch.scale,
          [&](int32_t j) { return page(j) + static_cast<int64_t>(j % ps) * hd; },
          [&](int32_t j) { return page(j) + (static_cast<int64_t>(ps) + j % ps) * hd; }, &scores,
          &acc, out->row(seq.q_begin + tk.row) + static_cast<int64_t>(h) * hd);
    }
  });
}

void CpuBackend::SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                       const PagePoolView& pool, Mat* out) {
  VisitDType(pool.dtype, [&](auto tag) {
    SparseDecodeAttentionTyped(q, batch, pool, static_cast<const decltype(tag)*>(pool.base), out);
  });
}

template <typename T>
void CpuBackend::SparseDecodeAttentionTyped(const Mat& q, const SparseAttentionBatch& batch,
                                            const PagePoolView& pool, const T* base, Mat* out) {
  const int32_t hd = pool.head_dim;
  const int32_t ps = pool.page_size;
  const int32_t heads = batch.num_heads;
  const int32_t group = heads / batch.num_kv_heads;
  CHECK_EQ(batch.page_begin.size(), static_cast<size_t>(q.rows * batch.num_kv_heads + 1));
  CHECK_EQ(batch.pages.size(), batch.page_tokens.size());
  pool_.ParallelFor(q.rows * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(hd);
    // Token j of the selection -> (page entry, offset), rebuilt per (row, KV head).
    std::vector<std::pair<int32_t, int32_t>> where;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / heads;
      const int32_t h = static_cast<int32_t>(task % heads);
      const int64_t list = row * batch.num_kv_heads + h / group;
      where.clear();
      for (int32_t e = batch.page_begin[list]; e < batch.page_begin[list + 1]; ++e) {
        CHECK(batch.page_tokens[e] >= 1 && batch.page_tokens[e] <= ps);
        for (int32_t t = 0; t < batch.page_tokens[e]; ++t) where.emplace_back(e, t);
      }
      CHECK(!where.empty()) << "sparse attention row " << row << " has no keys";
      auto page = [&](int32_t j) {
        return base + static_cast<size_t>(batch.pages[where[j].first]) * pool.page_elems();
      };
      AttendOneHead(
          q.row(row) + static_cast<int64_t>(h) * hd, static_cast<int32_t>(where.size()), hd,
          batch.scale,
          [&](int32_t j) { return page(j) + static_cast<int64_t>(where[j].second) * hd; },
          [&](int32_t j) { return page(j) + (static_cast<int64_t>(ps) + where[j].second) * hd; },
          &scores, &acc, out->row(row) + static_cast<int64_t>(h) * hd);
    }
  });
}

}  // namespace specula
