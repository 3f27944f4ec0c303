// `specula-bench attention`: the prefill attention kernels alone, through the Backend's
// PagedAttention, on random bf16 KV in pages. For each head_dim (the Llama-3.2-1B shape: 32 query
// heads, 8 KV heads, head_dim 64; the Llama-3.1-8B shape: the same heads at 128) and each
// context N: the whole prompt as one chunk (N rows over N keys) and the engine's last chunk
// (`chunk_rows` rows after N - chunk_rows cached keys), with the sequence given (the tile kernel)
// and without (the row kernel). Reports the median time and causal TFLOP/s (4 * head_dim *
// heads FLOPs per (row, key) pair a row attends to). Then decode: for each (batch, context) shape,
// one query row per sequence over its `context` keys, cycling through enough copies of the KV that
// L2 holds none of it; reports the median time per layer and the KV bytes read per second, to set
// against the card's copy bandwidth. Last, the decode GEMM table (tools/bench/decode_gemm_bench.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/common/device_kind.h"

namespace specula {

struct AttentionBenchOptions {
  DeviceKind device = DeviceKind::kCuda;
  std::vector<int> contexts = {1024, 4096, 8192, 16384, 32768};
  std::vector<int> head_dims = {64, 128};
  int chunk_rows = 512;
  // The row kernel is timed up to this context for whole prompts (it is quadratic and slow).
  int row_kernel_max_context = 8192;
  int repeats = 7;
  bool prefill = true;  // the prefill table
  // (batch, context) of the decode table; empty skips it.
  std::vector<std::pair<int, int>> decode_shapes = {{1, 1024}, {1, 8192},  {1, 32768},
                                                    {8, 4096}, {32, 4096}, {64, 1024}};
  // Model shapes of the decode GEMM table (tools/bench/decode_gemm_bench.h); empty skips it.
  std::vector<std::string> gemm_models = {"1b", "8b"};
  std::vector<int> gemm_rows = {1, 8};  // rows of x in that table
  bool dependent_launches = true;       // model.dependent_launches of the backend
};

// Prints a Markdown table to stdout; returns a process exit code.
int RunAttentionBench(const AttentionBenchOptions& options);

}  // namespace specula
