// `specula-bench cpu`: offline engine throughput on the CPU backend beside the machine's
// memory-bandwidth bound for decode.
#pragma once

#include <string>
#include <vector>

namespace specula {

struct CpuBenchOptions {
  std::vector<std::string> presets = {"tiny", "100m"};
  std::vector<int> decode_batches = {1, 8};
  int prompt_tokens = 512;
  int decode_tokens = 64;
  int threads = 0;
  std::string work_dir;  // where generated models go; a temp dir when empty
};

// Prints a Markdown table to stdout; returns a process exit code.
int RunCpuBench(const CpuBenchOptions& options);

}  // namespace specula
