#include "tools/bench/attention_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/common/ceil_div.h"

namespace specula {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kPageSize = 16;
constexpr DType kKvDtype = DType::kBF16;

std::vector<float> Random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int32_t>(seed >> 33) % 2001) / 1000.0f - 1.0f;
  }
  return v;
}

// Backend memory holding `values`.
template <typename T>
absl::StatusOr<DeviceBuffer> Upload(Backend& b, const std::vector<T>& values) {
  auto buffer = b.Allocate(std::max<size_t>(values.size(), 1) * sizeof(T));
  if (buffer.ok() && !values.empty()) {
    b.CopyToDevice(buffer->data(), values.data(), values.size() * sizeof(T));
  }
  return buffer;
}

template <typename T>
DeviceSpan<const T> Span(const DeviceBuffer& b) {
  return DeviceSpan<const T>(static_cast<const T*>(b.data()), b.bytes() / sizeof(T));
}

// One context's KV pages, queries and output in backend memory.
struct Problem {
  int head_dim = 0;
  int keys = 0;
  KvLayerView layer;
  DeviceBuffer pages, q, out, blocks;
  int64_t width() const { return static_cast<int64_t>(kHeads) * head_dim; }
};

absl::StatusOr<Problem> MakeProblem(Backend& b, int head_dim, int keys) {
  Problem p;
  p.head_dim = head_dim;
  p.keys = keys;
  const auto num_blocks = static_cast<int>(CeilDiv(keys, kPageSize));
  p.layer = KvLayerView{nullptr, kKvDtype, kKvHeads, kPageSize, head_dim};
  auto pages = b.Allocate(static_cast<size_t>(num_blocks) * kKvHeads * p.layer.page_bytes());
  if (!pages.ok()) return pages.status();
  p.pages = std::move(*pages);
  p.layer.base = p.pages.data();
  std::vector<int32_t> table(num_blocks), write_blocks(keys), write_offsets(keys);
  std::iota(table.begin(), table.end(), 0);
  for (int t = 0; t < keys; ++t) {
    write_blocks[t] = t / kPageSize;
    write_offsets[t] = t % kPageSize;
  }
  const int64_t kv_width = static_cast<int64_t>(kKvHeads) * head_dim;
  auto k = Upload(b, Random(keys * kv_width, 1)), v = Upload(b, Random(keys * kv_width, 2));
  auto wb = Upload(b, write_blocks), wo = Upload(b, write_offsets);
  auto blocks = Upload(b, table), q = Upload(b, Random(keys * p.width(), 3));
  auto out = b.Allocate(static_cast<size_t>(keys) * p.width() * sizeof(float));
  for (const auto* s : {&k, &v, &wb, &wo, &blocks, &q, &out}) {
    if (!s->ok()) return s->status();
  }
  b.WriteKv(Mat(static_cast<float*>(k->data()), keys, kv_width),
            Mat(static_cast<float*>(v->data()), keys, kv_width),
            KvWrite{Span<int32_t>(*wb), Span<int32_t>(*wo)}, p.layer);
  b.Synchronize();
  p.blocks = std::move(*blocks);
  p.q = std::move(*q);
  p.out = std::move(*out);
  return p;
}

struct Timing {
  double ms = 0;
  double tflops = 0;
};

// The last `rows` rows of the prompt (all of it when rows == keys), attended with the sequence
// given (tile kernel) or not (row kernel).
absl::StatusOr<Timing> Time(Backend& b, const Problem& p, int rows, bool tiles, int repeats) {
  std::vector<int32_t> row_keys(rows), row_begin(rows, 0), seq_rows = {0, rows};
  double pairs = 0;
  for (int r = 0; r < rows; ++r) {
    row_keys[r] = p.keys - rows + r + 1;
    pairs += row_keys[r];
  }
  auto keys = Upload(b, row_keys), begins = Upload(b, row_begin), seqs = Upload(b, seq_rows);
  for (const auto* s : {&keys, &begins, &seqs}) {
    if (!s->ok()) return s->status();
  }
  AttentionBatch batch;
  batch.rows = rows;
  batch.row_keys = Span<int32_t>(*keys);
  batch.row_block_begin = Span<int32_t>(*begins);
  batch.blocks = Span<int32_t>(p.blocks);
  batch.max_keys = p.keys;
  batch.num_heads = kHeads;
  batch.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (tiles) {
    batch.seq_rows = Span<int32_t>(*seqs);
    batch.seqs = 1;
    batch.max_seq_rows = rows;
  }
  Mat q(static_cast<float*>(p.q.data()), rows, p.width());
  Mat out(static_cast<float*>(p.out.data()), rows, p.width());
  b.PagedAttention(q, batch, p.layer, &out);  // warm-up
  b.Synchronize();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    b.PagedAttention(q, batch, p.layer, &out);
    b.Synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.ms = ms[ms.size() / 2];
  t.tflops = 4.0 * p.head_dim * kHeads * pairs / (t.ms * 1e-3) / 1e12;
  return t;
}

void PrintRow(int head_dim, int context, const char* what, int rows, const Timing& tile,
              const absl::StatusOr<Timing>* row_kernel) {
  std::printf("| %d | %d | %s (%d rows) | %.3f | %.1f |", head_dim, context, what, rows, tile.ms,
              tile.tflops);
  if (row_kernel != nullptr && row_kernel->ok()) {
    std::printf(" %.3f | %.2f | %.1fx |\n", (*row_kernel)->ms, (*row_kernel)->tflops,
                (*row_kernel)->ms / tile.ms);
  } else {
    std::printf(" — | — | — |\n");
  }
}

}  // namespace

int RunAttentionBench(const AttentionBenchOptions& o) {
  BackendOptions bo;
  bo.device = o.device;
  auto backend = CreateBackend(bo);
  if (!backend.ok()) {
    std::cerr << "specula-bench: " << backend.status() << "\n";
    return 1;
  }
  Backend& b = **backend;
  std::printf("Prefill attention on %s: %d query heads, %d KV heads, bf16 KV in %d-token pages\n\n",
              b.name().c_str(), kHeads, kKvHeads, kPageSize);
  std::printf(
      "| head_dim | context | chunk | tile ms | tile TFLOP/s | row ms | row TFLOP/s | "
      "speedup |\n|---|---|---|---|---|---|---|---|\n");
  for (int head_dim : o.head_dims) {
    for (int context : o.contexts) {
      auto problem = MakeProblem(b, head_dim, context);
      if (!problem.ok()) {
        std::cerr << "specula-bench: context " << context << ": " << problem.status() << "\n";
        return 1;
      }
      const int chunk = std::min(o.chunk_rows, context);
      for (const int rows : {context, chunk}) {
        if (rows == chunk && chunk == context) continue;  // the whole prompt already
        auto tile = Time(b, *problem, rows, /*tiles=*/true, o.repeats);
        if (!tile.ok()) {
          std::cerr << "specula-bench: " << tile.status() << "\n";
          return 1;
        }
        const bool time_rows = rows == chunk || context <= o.row_kernel_max_context;
        absl::StatusOr<Timing> row_kernel = absl::UnavailableError("not timed");
        if (time_rows) row_kernel = Time(b, *problem, rows, /*tiles=*/false, 3);
        PrintRow(head_dim, context, rows == context ? "whole prompt" : "last chunk", rows, *tile,
                 time_rows ? &row_kernel : nullptr);
      }
    }
  }
  return 0;
}

}  // namespace specula
