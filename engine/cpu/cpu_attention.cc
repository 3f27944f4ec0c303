// The CPU backend's KV writes and attention (dense paged and sparse page lists).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/common/check.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/dot.h"
#include "engine/cpu/scratch.h"

namespace specula {
namespace {

// Stores rows of fp32 K and V into pages of element type T (rounded to nearest even).
template <typename T>
void WriteKvTyped(const Mat& k, const Mat& v, absl::Span<const int32_t> blocks,
                  absl::Span<const int32_t> offsets, const KvLayerView& layer) {
  const int32_t hd = layer.head_dim;
  auto* base = static_cast<T*>(layer.base);
  for (int64_t t = 0; t < k.rows; ++t) {
    for (int32_t h = 0; h < layer.num_kv_heads; ++h) {
      T* page =
          base + (static_cast<size_t>(blocks[t]) * layer.num_kv_heads + h) * layer.page_elems();
      T* k_dst = page + static_cast<int64_t>(offsets[t]) * hd;
      T* v_dst = page + (static_cast<int64_t>(layer.page_size) + offsets[t]) * hd;
      const float* k_src = k.row(t) + static_cast<int64_t>(h) * hd;
      const float* v_src = v.row(t) + static_cast<int64_t>(h) * hd;
      for (int32_t c = 0; c < hd; ++c) {
        k_dst[c] = FromF32<T>(k_src[c]);
        v_dst[c] = FromF32<T>(v_src[c]);
      }
    }
  }
}

// Softmax attention of one query head over the keys of `n_pages` pages, visited in order:
// page(i) gives page i's storage (K [page_size][head_dim] then V) and how many of its first tokens
// count. Shared by the dense and sparse paths so that, given the same keys in the same order,
// they compute bit-identical results.
template <typename T, typename PageFn>
void AttendPages(const float* qv, int32_t n_pages, PageFn page, int32_t hd, int32_t ps, float scale,
                 std::vector<float>* scores, std::vector<float>* acc, float* out) {
  scores->clear();
  ReserveScratch(*scores, static_cast<size_t>(n_pages) * ps);
  float max_score = -INFINITY;
  for (int32_t i = 0; i < n_pages; ++i) {
    const auto [keys, tokens] = page(i);
    for (int32_t t = 0; t < tokens; ++t) {
      scores->push_back(Dot(qv, keys + static_cast<int64_t>(t) * hd, hd) * scale);
      max_score = std::max(max_score, scores->back());
    }
  }
  double denom = 0.0;
  acc->assign(hd, 0.0f);
  size_t j = 0;
  for (int32_t i = 0; i < n_pages; ++i) {
    const auto [keys, tokens] = page(i);
    for (int32_t t = 0; t < tokens; ++t, ++j) {
      const float p = std::exp((*scores)[j] - max_score);
      denom += p;
      AddScaled(p, keys + (static_cast<int64_t>(ps) + t) * hd, acc->data(), hd);
    }
  }
  const float inv = static_cast<float>(1.0 / denom);
  for (int32_t c = 0; c < hd; ++c) out[c] = (*acc)[c] * inv;
}

template <typename T>
void PagedAttentionTyped(ThreadPool& pool, const Mat& q, const AttentionBatch& batch,
                         absl::Span<const int32_t> row_keys,
                         absl::Span<const int32_t> row_block_begin,
                         absl::Span<const int32_t> blocks, const KvLayerView& layer, Mat* out) {
  const auto* base = static_cast<const T*>(layer.base);
  const int32_t hd = layer.head_dim;
  const int32_t heads = batch.num_heads;
  const int32_t group = heads / layer.num_kv_heads;
  const int32_t ps = layer.page_size;
  // One task per (query row, head).
  pool.ParallelFor(static_cast<int64_t>(batch.rows) * heads, 1, [&](int64_t begin, int64_t end) {
    // Each thread's, kept across calls: a steady decode step allocates nothing here.
    thread_local std::vector<float> scores, acc;
    for (int64_t task = begin; task < end; ++task) {
      const int32_t r = static_cast<int32_t>(task / heads);
      const int32_t h = static_cast<int32_t>(task % heads);
      const int32_t kv_h = h / group;
      const int32_t n_keys = row_keys[r];
      CHECK(n_keys >= 1) << "paged attention row " << r << " has no keys";
      const int32_t* table = blocks.data() + row_block_begin[r];
      const auto page = [&](int32_t i) {
        return std::pair<const T*, int32_t>(
            base + (static_cast<size_t>(table[i]) * layer.num_kv_heads + kv_h) * layer.page_elems(),
            std::min(ps, n_keys - i * ps));
      };
      const int64_t row = batch.first_row + r;
      AttendPages<T>(q.row(row) + static_cast<int64_t>(h) * hd,
                     static_cast<int32_t>((n_keys + ps - 1) / ps), page, hd, ps, batch.scale,
                     &scores, &acc, out->row(row) + static_cast<int64_t>(h) * hd);
    }
  });
}

template <typename T>
void SparseAttentionTyped(ThreadPool& pool, const Mat& q, const SparseAttentionBatch& batch,
                          absl::Span<const int32_t> list_begin,
                          absl::Span<const int32_t> list_count, absl::Span<const int32_t> pages,
                          absl::Span<const int32_t> page_tokens, const PagePoolView& device_pool,
                          const PagePoolView& host_pool, Mat* out) {
  const int32_t hd = device_pool.head_dim;
  const int32_t ps = device_pool.page_size;
  const int32_t kv_heads = batch.num_kv_heads;
  const int32_t group = batch.num_heads / kv_heads;
  // One task per (row, KV head): its list is read once for the group's query heads.
  pool.ParallelFor(static_cast<int64_t>(batch.rows) * kv_heads, 1, [&](int64_t begin, int64_t end) {
    // Each thread's, kept across calls: a steady decode step allocates nothing here.
    thread_local std::vector<float> scores, acc;
    thread_local std::vector<std::pair<const T*, int32_t>> pages_of;  // the list's pages, tokens
    ReserveScratch(pages_of, 1);
    for (int64_t list = begin; list < end; ++list) {
      const int64_t row = batch.first_row + list / kv_heads;
      const int32_t kv_h = static_cast<int32_t>(list % kv_heads);
      pages_of.clear();
      const int32_t first = list_begin[list];
      for (int32_t e = first; e < first + list_count[list]; ++e) {
        const int32_t ref = pages[e];
        CHECK(page_tokens[e] >= 1 && page_tokens[e] <= ps) << "page tokens " << page_tokens[e];
        pages_of.emplace_back(
            static_cast<const T*>(IsHostPageRef(ref) ? host_pool.page(HostPageOf(ref))
                                                     : device_pool.page(ref)),
            page_tokens[e]);
      }
      CHECK(!pages_of.empty()) << "sparse attention list " << list << " has no keys";
      for (int32_t g = 0; g < group; ++g) {
        const int32_t h = kv_h * group + g;
        AttendPages<T>(
            q.row(row) + static_cast<int64_t>(h) * hd, static_cast<int32_t>(pages_of.size()),
            [&](int32_t i) { return pages_of[i]; }, hd, ps, batch.scale, &scores, &acc,
            out->row(row) + static_cast<int64_t>(h) * hd);
      }
    }
  });
}

}  // namespace

void CpuBackend::WriteKv(const Mat& k, const Mat& v, const KvWrite& where,
                         const KvLayerView& layer) {
  const absl::Span<const int32_t> blocks = Host(where.blocks);
  const absl::Span<const int32_t> offsets = Host(where.offsets);
  CHECK(static_cast<int64_t>(blocks.size()) >= k.rows &&
        static_cast<int64_t>(offsets.size()) >= k.rows);
  VisitDType(layer.dtype,
             [&](auto tag) { WriteKvTyped<decltype(tag)>(k, v, blocks, offsets, layer); });
}

void CpuBackend::PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                                Mat* out) {
  const absl::Span<const int32_t> row_keys = Host(batch.row_keys);
  const absl::Span<const int32_t> row_block_begin = Host(batch.row_block_begin);
  const absl::Span<const int32_t> blocks = Host(batch.blocks);
  CHECK(row_keys.size() >= static_cast<size_t>(batch.rows) &&
        row_block_begin.size() >= static_cast<size_t>(batch.rows));
  VisitDType(layer.dtype, [&](auto tag) {
    PagedAttentionTyped<decltype(tag)>(pool_, q, batch, row_keys, row_block_begin, blocks, layer,
                                       out);
  });
}

void CpuBackend::SparseDecodeAttention(const Mat& q, const SparseAttentionBatch& batch,
                                       const PagePoolView& device_pool,
                                       const PagePoolView& host_pool, Mat* out) {
  CHECK(host_pool.base == nullptr ||
        (host_pool.dtype == device_pool.dtype && host_pool.page_size == device_pool.page_size &&
         host_pool.head_dim == device_pool.head_dim))
      << "the host and device page pools must have the same page layout";
  const absl::Span<const int32_t> list_begin = Host(batch.list_begin);
  const absl::Span<const int32_t> list_count = Host(batch.list_count);
  const size_t lists = static_cast<size_t>(batch.rows) * batch.num_kv_heads;
  CHECK(list_begin.size() >= lists && list_count.size() >= lists);
  const absl::Span<const int32_t> pages = Host(batch.pages);
  const absl::Span<const int32_t> tokens = Host(batch.page_tokens);
  VisitDType(device_pool.dtype, [&](auto tag) {
    SparseAttentionTyped<decltype(tag)>(pool_, q, batch, list_begin, list_count, pages, tokens,
                                        device_pool, host_pool, out);
  });
}

}  // namespace specula
