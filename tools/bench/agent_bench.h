// `specula-bench agent`: synthetic multi-turn agent conversations replayed through the engine,
// with and without KV reuse (docs/SESSIONS.md). Each conversation starts with a shared system
// prompt and a user message; every turn the agent's answer and a tool result of `tool_tokens`
// tokens are appended, and after `think_ms` the next turn is sent. Reports TTFT per turn for each
// mode, the new tokens each turn had to prefill, and the KV memory the sessions kept.
#pragma once

#include <string>
#include <vector>

#include "engine/common/device_kind.h"

namespace specula {

struct AgentBenchOptions {
  std::string model_dir;  // "" = generate the 100m benchmark model in work_dir
  std::string work_dir;   // "" = a temp dir
  int conversations = 4;  // run concurrently
  int turns = 10;
  int system_tokens = 512;  // shared by every conversation
  int user_tokens = 64;     // the first turn's own text
  int tool_tokens = 64;     // appended each turn after the answer
  int output_tokens = 32;   // per turn (greedy, EOS ignored)
  int think_ms = 0;         // between a turn's end and the next turn
  int threads = 0;
  DeviceKind device = DeviceKind::kCpu;  // model.device
  // none: every turn prefilled whole; prefix: kv_cache.prefix_cache without sessions;
  // session: session_id per conversation; offload: sessions with a host store, so they wait in
  // host memory between turns. Empty: only the suffix probe.
  std::vector<std::string> modes = {"none", "prefix", "session"};
  // The issue-12 target, measured alone: TTFT of a request whose cached prefix is 0 tokens (a
  // first turn), the first turn's context, and the last turn's, each followed by the same
  // tool_tokens + 1 new tokens; the median of this many requests per context (0 = skip).
  int suffix_probe_repeats = 5;
};

// Prints Markdown tables to stdout; returns a process exit code.
int RunAgentBench(const AgentBenchOptions& options);

}  // namespace specula
