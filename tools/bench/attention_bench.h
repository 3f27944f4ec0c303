// `specula-bench attention`: the prefill attention kernels alone, through the Backend's
// PagedAttention, on random bf16 KV in pages. For each head_dim (the Llama-3.2-1B shape: 32 query
// heads, 8 KV heads, head_dim 64; the Llama-3.1-8B shape: the same heads at 128) and each
// context N: the whole prompt as one chunk (N rows over N keys) and the engine's last chunk
// (`chunk_rows` rows after N - chunk_rows cached keys), with the sequence given (the tile kernel)
// and without (the row kernel). Reports the median time and causal TFLOP/s (4 * head_dim *
// heads FLOPs per (row, key) pair a row attends to).
#pragma once

#include <string>
#include <vector>

namespace specula {

struct AttentionBenchOptions {
  std::string device = "cuda";
  std::vector<int> contexts = {1024, 4096, 8192, 16384, 32768};
  std::vector<int> head_dims = {64, 128};
  int chunk_rows = 512;
  // The row kernel is timed up to this context for whole prompts (it is quadratic and slow).
  int row_kernel_max_context = 8192;
  int repeats = 7;
};

// Prints a Markdown table to stdout; returns a process exit code.
int RunAttentionBench(const AttentionBenchOptions& options);

}  // namespace specula
