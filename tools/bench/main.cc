// specula-bench: benchmarks. Results go to docs/BENCHMARKS.md with the machine and the date.
//   specula-bench cpu [--presets tiny,100m] [--batches 1,8] [--prompt-tokens 512]
//   specula-bench serve --server HOST:PORT [--num-prompts 200] [--input-len 128]
//       [--output-len 128] [--concurrency C | --request-rate R [--max-concurrency C]]
//       [--warmup N] [--json FILE] [--compare-engine [--model DIR]] [--server-pid PID]
//       [--session-suffix-len N]
//   specula-bench sparse [--retrieval-dir tests/fixtures/retrieval_model] [--contexts 256,512]
//       [--budgets 1,0.5,0.25,0.125] [--tbt-contexts 8192,32768] [--tbt-decode-tokens 32]
//       [--miss-policy auto|defer|fetch] [--miss-correction 0.75]
//   specula-bench agent [--model DIR] [--conversations 4] [--turns 10] [--system-tokens 512]
//       [--user-tokens 64] [--tool-tokens 64] [--output-tokens 32] [--think-ms 0]
//       [--modes none,prefix,session]
//   specula-bench attention [--device cuda] [--contexts 1024,8192,32768] [--head-dims 64,128]
//       [--chunk-rows 512] [--prefill=false] [--decode-shapes 1x1024,32x4096] [--gemm-models 1b]
// Flags may be spelled with dashes or underscores.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tools/bench/agent_bench.h"
#include "tools/bench/attention_bench.h"
#include "tools/bench/constrained_bench.h"
#include "tools/bench/cpu_bench.h"
#include "tools/bench/decode_gemm_bench.h"
#include "tools/bench/grammar_bench.h"
#include "tools/bench/sampling_bench.h"
#include "tools/bench/serve_bench.h"
#include "tools/bench/sparse_bench.h"
#include "tools/common/dashed_flags.h"

// cpu
ABSL_FLAG(std::vector<std::string>, presets, std::vector<std::string>({"tiny", "100m"}),
          "cpu: model presets (make-tiny-model --preset) to benchmark");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8"}),
          "cpu: decode batch sizes");
ABSL_FLAG(int32_t, prompt_tokens, 512, "cpu: prompt length for the prefill measurement");
ABSL_FLAG(int32_t, decode_tokens, 64, "cpu: tokens generated per sequence when measuring decode");
ABSL_FLAG(std::string, work_dir, "", "cpu: directory for generated models (default: a temp dir)");
ABSL_FLAG(int32_t, threads, 0,
          "CPU threads of the engine (cpu; serve --compare-engine), 0 = all cores");

// serve
ABSL_FLAG(std::string, server, "127.0.0.1:50051", "serve: the server's gRPC address HOST:PORT");
ABSL_FLAG(int32_t, num_prompts, 200, "serve: measured requests");
ABSL_FLAG(int32_t, input_len, 128, "serve: prompt tokens per request (random ids, seeded)");
ABSL_FLAG(int32_t, output_len, 128, "serve: output tokens per request (max_tokens, ignore_eos)");
ABSL_FLAG(uint64_t, seed, 0, "serve: seed of the prompts and the arrival times");
ABSL_FLAG(int32_t, concurrency, 0,
          "serve: closed loop with this many clients sending back to back (default 64 when "
          "--request-rate is not given)");
ABSL_FLAG(std::string, request_rate, "",
          "serve: Poisson arrivals at this many requests/s; 'inf' sends all at once");
ABSL_FLAG(int32_t, max_concurrency, 0, "serve: with --request-rate, most requests in flight");
ABSL_FLAG(int32_t, warmup, 0, "serve: requests sent first and not counted");
ABSL_FLAG(int32_t, session_suffix_len, 0,
          "serve: > 0: send each prompt first under its own session (max_tokens 1, not measured), "
          "then measure the sessions' next turns: the prompt and this many new tokens, its KV "
          "reused (a long cached context and a short new input, as agents send)");
ABSL_FLAG(double, timeout, 0, "serve: per-request deadline in seconds, 0 = none");
ABSL_FLAG(std::string, json, "", "serve: write every result (and each request's timings) here");
ABSL_FLAG(bool, compare_engine, false,
          "serve: afterwards, run the same requests through the in-process engine at the same "
          "batch and print served/engine tokens/s (the server must be idle and serve --model)");
ABSL_FLAG(std::string, model, "",
          "serve --compare-engine: the server's model directory (default: the embedded tiny "
          "model); constrained: the model to run (one with a real tokenizer)");
ABSL_FLAG(int32_t, server_pid, 0,
          "serve: pid of a server on this machine; reports its CPU time per thread name "
          "(engine vs gRPC threads) during the run");

// sparse
ABSL_FLAG(std::string, retrieval_dir, "tests/fixtures/retrieval_model",
          "sparse: the retrieval model with its eval_<ctx>.json sets; '' skips the quality part");
ABSL_FLAG(std::vector<std::string>, contexts, {},
          "sparse: eval context lengths to run (default: every eval file)");
ABSL_FLAG(std::vector<std::string>, budgets,
          std::vector<std::string>({"1", "0.5", "0.25", "0.125"}),
          "sparse: budgets as fractions of the context (1 = full)");
ABSL_FLAG(std::vector<std::string>, tbt_contexts, std::vector<std::string>({"8192", "32768"}),
          "sparse: contexts of the batch-1 TBT / memory measurement (none: skip it)");
ABSL_FLAG(int32_t, tbt_decode_tokens, 32, "sparse: decode steps timed per TBT measurement");
ABSL_FLAG(double, prefetch_extra, -1,
          "sparse: sparse.prefetch_extra_tokens as a fraction of the budget (cross_step's slots "
          "beyond it); negative: the server's default, half");
ABSL_FLAG(std::string, miss_policy, "auto",
          "sparse: sparse.miss_policy of every sparse run (auto | defer | fetch; auto is fetch "
          "on the CPU backend the bench runs)");
ABSL_FLAG(double, miss_correction, specula::SparseOptions().miss_correction,
          "sparse: sparse.miss_correction of every sparse run (under defer)");
ABSL_FLAG(std::vector<std::string>, kv_dtypes, std::vector<std::string>({"f32", "bf16"}),
          "sparse: KV dtypes (kv_cache.dtype) of the cost part; the quality part uses the first");

// agent
ABSL_FLAG(int32_t, conversations, 4, "agent: conversations run concurrently");
ABSL_FLAG(int32_t, turns, 10, "agent: turns per conversation");
ABSL_FLAG(int32_t, system_tokens, 512, "agent: system prompt shared by every conversation");
ABSL_FLAG(int32_t, user_tokens, 64, "agent: each conversation's first user message");
ABSL_FLAG(int32_t, tool_tokens, 64, "agent: tool result appended after each answer");
ABSL_FLAG(int32_t, output_tokens, 32, "agent: answer tokens per turn");
ABSL_FLAG(int32_t, think_ms, 0, "agent: pause between a turn's end and the next turn");
ABSL_FLAG(std::string, device, "cpu",
          "agent, attention, sampling, constrained: model.device of the engine (cpu | cuda | "
          "auto)");
ABSL_FLAG(int32_t, suffix_probe_repeats, 5,
          "agent: afterwards, TTFT of a turn's new tokens after a cached prefix of 0, the first "
          "turn's and the last turn's context, one request at a time: the median of this many "
          "(0 = skip)");
ABSL_FLAG(std::vector<std::string>, modes, std::vector<std::string>({"none", "prefix", "session"}),
          "agent: none (no reuse), prefix (kv_cache.prefix_cache), session (session_id), "
          "offload (session_id with a host store: sessions wait in host memory)");

// attention
ABSL_FLAG(std::vector<std::string>, head_dims, std::vector<std::string>({"64", "128"}),
          "attention: head sizes (64: the Llama-3.2-1B shape, 128: Llama-3.1-8B)");
ABSL_FLAG(int32_t, chunk_rows, 512, "attention: rows of the last prefill chunk timed");
ABSL_FLAG(bool, prefill, true, "attention: time the prefill kernels");
ABSL_FLAG(std::vector<std::string>, decode_shapes,
          std::vector<std::string>({"1x1024", "1x8192", "1x32768", "8x4096", "32x4096", "64x1024"}),
          "attention: decode shapes BATCHxCONTEXT (one query row per sequence); empty: none");
ABSL_FLAG(std::vector<std::string>, gemm_models, std::vector<std::string>({"1b", "8b"}),
          "attention: model shapes of the decode GEMM table (1b: Llama-3.2-1B's projections, "
          "8b: Llama-3.1-8B's); empty: none");
ABSL_FLAG(std::vector<std::string>, gemm_rows, std::vector<std::string>({"1", "8"}),
          "attention: rows of x in the decode GEMM table (1 to 64)");
ABSL_FLAG(bool, dependent_launches, true,
          "attention: model.dependent_launches of the backend (false: each kernel launched after "
          "the one ahead ends)");

// sampling
ABSL_FLAG(int64_t, vocab, 128256, "sampling: tokens per row of logits");
ABSL_FLAG(std::vector<std::string>, sampling_rows,
          std::vector<std::string>({"1", "8", "64", "128"}), "sampling: rows per step timed");

// grammar
ABSL_FLAG(std::string, tokenizer_dir, "", "grammar: directory holding the tokenizer.json");
ABSL_FLAG(std::string, schemas, "tests/engine/grammar/agent_schemas.json",
          "grammar: JSON array of {\"schema\", \"strict\"}");
ABSL_FLAG(int, mask_threads, 1, "grammar: threads that build a mask cache entry (1: one)");
ABSL_FLAG(bool, share_walks, true,
          "grammar: share costly walks between schemas, as the server does (false: each schema's "
          "cache alone)");
ABSL_FLAG(bool, prepare, true,
          "grammar, constrained: prepare each schema's mask cache before its first walk or "
          "request, as the server does before admitting its first request");

// constrained
ABSL_FLAG(int32_t, batch, 32, "constrained: requests kept in flight");
ABSL_FLAG(int32_t, steps, 100, "constrained: steps timed per run");
ABSL_FLAG(int32_t, pairs, 5, "constrained: free/constrained pairs of runs, after a warm-up pair");
ABSL_FLAG(double, temperature, 1.0, "constrained: every request's (0 = greedy)");

namespace {

constexpr char kUsage[] =
    "specula-bench SUBCOMMAND [flags]: benchmarks, results to docs/BENCHMARKS.md.\n"
    "  cpu        engine throughput on generated models (--presets, --batches, --prompt-tokens)\n"
    "  serve      a running server over gRPC (--server HOST:PORT, --concurrency, --request-rate)\n"
    "  sparse     sparse vs dense decode and retrieval (--contexts, --budgets, --tbt-contexts)\n"
    "  agent      multi-turn agent traffic (--conversations, --turns, --modes)\n"
    "  attention  attention kernels and decode GEMMs (--device, --contexts, --decode-shapes, "
    "--gemm-models)\n"
    "  sampling   sampling on the device vs on the host (--device, --vocab, --sampling-rows)\n"
    "  grammar    structured outputs: schema compile and token mask times (--tokenizer-dir, "
    "--schemas)\n"
    "  constrained  a full batch with and without JSON-schema constraints (--model, --schemas, "
    "--batch, --device)";

// --device, or nullopt after saying why not.
std::optional<specula::DeviceKind> DeviceFlag() {
  absl::StatusOr<specula::DeviceKind> device =
      specula::ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (device.ok()) return *device;
  std::cerr << "specula-bench: --device: " << device.status().message() << "\n";
  return std::nullopt;
}

int RunConstrained() {
  const std::optional<specula::DeviceKind> device = DeviceFlag();
  if (!device) return 2;
  specula::ConstrainedBenchOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.schemas_file = absl::GetFlag(FLAGS_schemas);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.pairs = absl::GetFlag(FLAGS_pairs);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  o.prepare = absl::GetFlag(FLAGS_prepare);
  o.device = *device;
  return specula::RunConstrainedBench(o);
}

int RunAgent() {
  specula::AgentBenchOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.conversations = absl::GetFlag(FLAGS_conversations);
  o.turns = absl::GetFlag(FLAGS_turns);
  o.system_tokens = absl::GetFlag(FLAGS_system_tokens);
  o.user_tokens = absl::GetFlag(FLAGS_user_tokens);
  o.tool_tokens = absl::GetFlag(FLAGS_tool_tokens);
  o.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  o.think_ms = absl::GetFlag(FLAGS_think_ms);
  o.suffix_probe_repeats = absl::GetFlag(FLAGS_suffix_probe_repeats);
  const std::optional<specula::DeviceKind> device = DeviceFlag();
  if (!device) return 2;
  o.device = *device;
  o.threads = absl::GetFlag(FLAGS_threads);
  o.modes = absl::GetFlag(FLAGS_modes);
  return specula::RunAgentBench(o);
}

template <typename T>
bool ParseList(const char* flag, const std::vector<std::string>& in, std::vector<T>* out) {
  for (const std::string& s : in) {
    if (s == "none") continue;
    double v = 0;
    if (!absl::SimpleAtod(s, &v) || !(v > 0)) {
      std::cerr << "specula-bench: --" << flag << ": bad value '" << s << "'\n";
      return false;
    }
    out->push_back(static_cast<T>(v));
  }
  return true;
}

int RunSparse() {
  specula::SparseBenchOptions o;
  o.retrieval_dir = absl::GetFlag(FLAGS_retrieval_dir);
  o.budgets.clear();
  o.tbt_contexts.clear();
  if (!ParseList("contexts", absl::GetFlag(FLAGS_contexts), &o.contexts) ||
      !ParseList("budgets", absl::GetFlag(FLAGS_budgets), &o.budgets) ||
      !ParseList("tbt-contexts", absl::GetFlag(FLAGS_tbt_contexts), &o.tbt_contexts)) {
    return 2;
  }
  for (double b : o.budgets) {
    if (b > 1) {
      std::cerr << "specula-bench: --budgets are fractions of the context, at most 1\n";
      return 2;
    }
  }
  o.tbt_decode_tokens = absl::GetFlag(FLAGS_tbt_decode_tokens);
  o.prefetch_extra = absl::GetFlag(FLAGS_prefetch_extra);
  const absl::StatusOr<specula::MissPolicy> miss =
      specula::ParseMissPolicy(absl::GetFlag(FLAGS_miss_policy));
  if (!miss.ok()) {
    std::cerr << "specula-bench: --miss-policy: " << miss.status().message() << "\n";
    return 2;
  }
  o.miss_policy = *miss;
  o.miss_correction = absl::GetFlag(FLAGS_miss_correction);
  specula::SparseOptions correction;  // the engine's own rule for the value
  correction.miss_correction = o.miss_correction;
  if (const absl::Status s = specula::ValidateSparseOptions(correction); !s.ok()) {
    std::cerr << "specula-bench: --miss-correction: " << s.message() << "\n";
    return 2;
  }
  o.kv_dtypes = absl::GetFlag(FLAGS_kv_dtypes);
  if (o.kv_dtypes.empty()) {
    std::cerr << "specula-bench: --kv-dtypes needs at least one of auto, bf16, f16, f32\n";
    return 2;
  }
  o.threads = absl::GetFlag(FLAGS_threads);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  return specula::RunSparseBench(o);
}

int RunAttention() {
  specula::AttentionBenchOptions o;
  const std::optional<specula::DeviceKind> device = DeviceFlag();
  if (!device) return 2;
  o.device = *device;
  std::vector<int> contexts, head_dims;
  if (!ParseList("contexts", absl::GetFlag(FLAGS_contexts), &contexts) ||
      !ParseList("head-dims", absl::GetFlag(FLAGS_head_dims), &head_dims)) {
    return 2;
  }
  if (!contexts.empty()) o.contexts = contexts;
  o.head_dims = head_dims;
  o.chunk_rows = absl::GetFlag(FLAGS_chunk_rows);
  if (o.chunk_rows < 1) {
    std::cerr << "specula-bench: --chunk-rows must be at least 1\n";
    return 2;
  }
  o.prefill = absl::GetFlag(FLAGS_prefill);
  o.decode_shapes.clear();
  for (const std::string& shape : absl::GetFlag(FLAGS_decode_shapes)) {
    const std::vector<std::string> parts = absl::StrSplit(shape, 'x');
    int batch = 0, context = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &batch) ||
        !absl::SimpleAtoi(parts[1], &context) || batch < 1 || context < 1) {
      std::cerr << "specula-bench: --decode-shapes: want BATCHxCONTEXT, got '" << shape << "'\n";
      return 2;
    }
    o.decode_shapes.emplace_back(batch, context);
  }
  o.gemm_models = absl::GetFlag(FLAGS_gemm_models);
  std::vector<int> gemm_rows;
  if (!ParseList("gemm-rows", absl::GetFlag(FLAGS_gemm_rows), &gemm_rows)) return 2;
  for (const int rows : gemm_rows) {
    if (rows < 1 || rows > 64) {
      std::cerr << "specula-bench: --gemm-rows: want 1 to 64, got " << rows << "\n";
      return 2;
    }
  }
  o.gemm_rows = gemm_rows;
  o.dependent_launches = absl::GetFlag(FLAGS_dependent_launches);
  for (const std::string& model : o.gemm_models) {
    if (!specula::DecodeGemmModelKnown(model)) {
      std::cerr << "specula-bench: --gemm-models: unknown model shape '" << model << "' (1b, 8b)\n";
      return 2;
    }
  }
  return specula::RunAttentionBench(o);
}

int RunSampling() {
  specula::SamplingBenchOptions o;
  const std::optional<specula::DeviceKind> device = DeviceFlag();
  if (!device) return 2;
  o.device = *device;
  o.vocab = absl::GetFlag(FLAGS_vocab);
  if (o.vocab < 1 || o.vocab > (int64_t{1} << 24)) {
    std::cerr << "specula-bench: --vocab must be in [1, 2^24]\n";
    return 2;
  }
  o.rows.clear();
  if (!ParseList("sampling-rows", absl::GetFlag(FLAGS_sampling_rows), &o.rows)) return 2;
  return specula::RunSamplingBench(o);
}

int RunCpu() {
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

int RunServe() {
  specula::ServeBenchOptions o;
  o.server = absl::GetFlag(FLAGS_server);
  o.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  o.input_len = absl::GetFlag(FLAGS_input_len);
  o.output_len = absl::GetFlag(FLAGS_output_len);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  o.json_path = absl::GetFlag(FLAGS_json);
  o.compare_engine = absl::GetFlag(FLAGS_compare_engine);
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.server_pid = absl::GetFlag(FLAGS_server_pid);
  o.session_suffix_len = absl::GetFlag(FLAGS_session_suffix_len);
  const std::string rate = absl::AsciiStrToLower(absl::GetFlag(FLAGS_request_rate));
  if (rate.empty()) {
    if (o.concurrency == 0) o.concurrency = 64;
  } else {
    if (o.concurrency > 0) {
      std::cerr << "specula-bench serve: give --concurrency or --request-rate, not both "
                   "(--max-concurrency caps the Poisson mode)\n";
      return 2;
    }
    if (rate == "inf") {
      o.request_rate = INFINITY;
    } else if (!absl::SimpleAtod(rate, &o.request_rate) || !(o.request_rate > 0)) {
      std::cerr << "specula-bench serve: --request-rate: want a positive number or inf, got '"
                << rate << "'\n";
      return 2;
    }
  }
  if (o.concurrency < 0 || o.max_concurrency < 0) {
    std::cerr << "specula-bench serve: --concurrency and --max-concurrency must be >= 0\n";
    return 2;
  }
  return specula::RunServeBench(o);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> storage;
  std::vector<char*> args = specula::ParseDashedCommandLine(argc, argv, &storage);
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command == "cpu") return RunCpu();
  if (command == "serve") return RunServe();
  if (command == "sparse") return RunSparse();
  if (command == "agent") return RunAgent();
  if (command == "attention") return RunAttention();
  if (command == "sampling") return RunSampling();
  if (command == "grammar") {
    specula::GrammarBenchOptions o;
    o.tokenizer_dir = absl::GetFlag(FLAGS_tokenizer_dir);
    o.schemas_file = absl::GetFlag(FLAGS_schemas);
    o.mask_threads = absl::GetFlag(FLAGS_mask_threads);
    o.share_walks = absl::GetFlag(FLAGS_share_walks);
    o.prepare = absl::GetFlag(FLAGS_prepare);
    return specula::RunGrammarBench(o);
  }
  if (command == "constrained") return RunConstrained();
  std::cerr << kUsage << "\n";
  return 2;
}
