// specula-bench: benchmarks. Results go to docs/BENCHMARKS.md with the machine and the date.
//   specula-bench cpu [--presets tiny,100m] [--batches 1,8] [--prompt_tokens 512]
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "tools/bench/cpu_bench.h"

ABSL_FLAG(std::vector<std::string>, presets, std::vector<std::string>({"tiny", "100m"}),
          "model presets (make-tiny-model --preset) to benchmark");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8"}),
          "decode batch sizes");
ABSL_FLAG(int32_t, prompt_tokens, 512, "prompt length for the prefill measurement");
ABSL_FLAG(int32_t, decode_tokens, 64, "tokens generated per sequence when measuring decode");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0 = all cores)");
ABSL_FLAG(std::string, work_dir, "", "directory for generated models (default: a temp dir)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("specula-bench cpu [flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2 || std::string(args[1]) != "cpu") {
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  specula::CpuBenchOptions o;
  o.presets = absl::GetFlag(FLAGS_presets);
  o.decode_batches.clear();
  for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1) {
      std::cerr << "specula-bench: --batches: bad batch size '" << b << "'\n";
      return 2;
    }
    o.decode_batches.push_back(n);
  }
  o.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  o.decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  return specula::RunCpuBench(o);
}
