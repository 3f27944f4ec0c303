#include "tools/bench/attention_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/backend_factory.h"
#include "engine/common/ceil_div.h"
#include "tools/bench/decode_gemm_bench.h"
#include "tools/bench/random_values.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kPageSize = 16;
constexpr DType kKvDtype = DType::kBF16;

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
  auto k = Upload(b, RandomValues(keys * kv_width, 1)),
       v = Upload(b, RandomValues(keys * kv_width, 2));
  auto wb = Upload(b, write_blocks), wo = Upload(b, write_offsets);
  auto blocks = Upload(b, table), q = Upload(b, RandomValues(keys * p.width(), 3));
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
  Timing t;
  t.ms = Median(std::move(ms));
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

// One layer's KV for `batch` sequences of `context` keys, copied `layers` times so the timed
// calls, cycling through the copies, read KV that is not in L2 (as decode, layer after layer,
// does).
struct DecodeProblem {
  int head_dim = 0, batch = 0, context = 0, layers = 0;
  int64_t layer_bytes = 0;
  DeviceBuffer pages, blocks, row_keys, row_begin, q, out;
};

constexpr int64_t kDecodeBytesTouched = int64_t{256} << 20;  // five times an H100's L2

absl::StatusOr<DecodeProblem> MakeDecodeProblem(Backend& b, int head_dim, int batch, int context) {
  DecodeProblem p;
  p.head_dim = head_dim;
  p.batch = batch;
  p.context = context;
  const auto pages_per_seq = static_cast<int32_t>(CeilDiv(context, kPageSize));
  const KvLayerView shape{nullptr, kKvDtype, kKvHeads, kPageSize, head_dim};
  p.layer_bytes = int64_t{batch} * pages_per_seq * kKvHeads * shape.page_bytes();
  p.layers = static_cast<int>(std::max<int64_t>(1, CeilDiv(kDecodeBytesTouched, p.layer_bytes)));
  // Random bf16 in [-1, 1]: the top half of each float.
  std::vector<float> values = RandomValues(static_cast<size_t>(p.layer_bytes / 2), 4);
  std::vector<uint16_t> bf16(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  auto pages = b.Allocate(static_cast<size_t>(p.layer_bytes) * p.layers);
  if (!pages.ok()) return pages.status();
  p.pages = std::move(*pages);
  for (int l = 0; l < p.layers; ++l) {
    b.CopyToDevice(static_cast<char*>(p.pages.data()) + l * p.layer_bytes, bf16.data(),
                   static_cast<size_t>(p.layer_bytes));
  }
  std::vector<int32_t> table(static_cast<size_t>(batch) * pages_per_seq), keys(batch, context),
      begins(batch);
  std::iota(table.begin(), table.end(), 0);
  for (int r = 0; r < batch; ++r) begins[r] = r * pages_per_seq;
  auto blocks = Upload(b, table), row_keys = Upload(b, keys), row_begin = Upload(b, begins);
  auto q = Upload(b, RandomValues(static_cast<size_t>(batch) * kHeads * head_dim, 5));
  auto out = b.Allocate(static_cast<size_t>(batch) * kHeads * head_dim * sizeof(float));
  for (const auto* s : {&blocks, &row_keys, &row_begin, &q, &out}) {
    if (!s->ok()) return s->status();
  }
  p.blocks = std::move(*blocks);
  p.row_keys = std::move(*row_keys);
  p.row_begin = std::move(*row_begin);
  p.q = std::move(*q);
  p.out = std::move(*out);
  b.Synchronize();
  return p;
}

// Median milliseconds of one layer's decode attention (one query row per sequence).
double TimeDecode(Backend& b, const DecodeProblem& p, int repeats) {
  AttentionBatch batch;
  batch.rows = p.batch;
  batch.row_keys = Span<int32_t>(p.row_keys);
  batch.row_block_begin = Span<int32_t>(p.row_begin);
  batch.blocks = Span<int32_t>(p.blocks);
  batch.max_keys = p.context;
  batch.num_heads = kHeads;
  batch.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  const int64_t width = static_cast<int64_t>(kHeads) * p.head_dim;
  Mat q(static_cast<float*>(p.q.data()), p.batch, width);
  Mat out(static_cast<float*>(p.out.data()), p.batch, width);
  auto all_layers = [&] {
    for (int l = 0; l < p.layers; ++l) {
      KvLayerView layer{static_cast<char*>(p.pages.data()) + l * p.layer_bytes, kKvDtype, kKvHeads,
                        kPageSize, p.head_dim};
      b.PagedAttention(q, batch, layer, &out);
    }
  };
  all_layers();  // warm-up
  b.Synchronize();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    all_layers();
    b.Synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        p.layers);
  }
  return Median(std::move(ms));
}

int RunDecodeTable(Backend& b, const AttentionBenchOptions& o) {
  std::printf(
      "\nDecode attention (one query row per sequence, KV read once): GB/s = KV bytes / time\n\n"
      "| head_dim | batch | context | KV MB | us | GB/s |\n|---|---|---|---|---|---|\n");
  for (int head_dim : o.head_dims) {
    for (const auto& [batch, context] : o.decode_shapes) {
      auto problem = MakeDecodeProblem(b, head_dim, batch, context);
      if (!problem.ok()) {
        std::cerr << "specula-bench: decode " << batch << "x" << context << ": " << problem.status()
                  << "\n";
        return 1;
      }
      const double ms = TimeDecode(b, *problem, o.repeats);
      // Bytes of the keys read (the last page may be partly used).
      const double bytes = 2.0 * batch * context * kKvHeads * head_dim * DTypeSize(kKvDtype);
      std::printf("| %d | %d | %d | %.1f | %.1f | %.0f |\n", head_dim, batch, context, bytes / 1e6,
                  ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    }
  }
  return 0;
}

int RunPrefillTable(Backend& b, const AttentionBenchOptions& o) {
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

}  // namespace

int RunAttentionBench(const AttentionBenchOptions& o) {
  BackendOptions bo;
  bo.device = o.device;
  bo.dependent_launches = o.dependent_launches;
  auto backend = CreateBackend(bo);
  if (!backend.ok()) {
    std::cerr << "specula-bench: " << backend.status() << "\n";
    return 1;
  }
  Backend& b = **backend;
  if (o.prefill) {
    const int status = RunPrefillTable(b, o);
    if (status != 0) return status;
  }
  if (!o.decode_shapes.empty()) {
    const int status = RunDecodeTable(b, o);
    if (status != 0) return status;
  }
  return o.gemm_models.empty() ? 0 : RunDecodeGemmTable(b, o.gemm_models, o.gemm_rows, o.repeats);
}

}  // namespace specula
