#include "tools/cli/offline_command.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/generate/generator.h"
#include "tools/cli/cli_flags.h"
#include "engine/model/tiny/default_model.h"

namespace specula {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "specula-cli: " << s << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// Logprobs go to stderr after the text so that stdout stays exactly the generated text.
void PrintLogprobs(const std::vector<SampledToken>& logprobs) {
  for (const SampledToken& t : logprobs) {
    std::cerr << absl::StrFormat("logprob token=%d %.4f", t.token, t.logprob);
    for (const TokenLogprob& alt : t.top) {
      std::cerr << absl::StrFormat(" %d:%.4f", alt.token, alt.logprob);
    }
    std::cerr << "\n";
  }
}

// The in-process engine. In-process there is no server configuration to defer to:
// --sparse-mode sparse switches the sparse cache on, its host store as large as the device cache
// (--kv_cache_tokens), so the one request fits wherever it would fit dense.
absl::StatusOr<std::unique_ptr<Generator>> CreateGenerator(const std::string& model_dir,
                                                           const SparseRequestOptions& sparse) {
  GeneratorOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.kv_cache_tokens = absl::GetFlag(FLAGS_kv_cache_tokens);
  options.page_size = absl::GetFlag(FLAGS_page_size);
  if (sparse.mode == SparseMode::kSparse) {
    options.sparse.enabled = true;
    options.host_capacity_tokens = options.kv_cache_tokens;
    if (sparse.budget_tokens > 0) options.sparse.budget_tokens = sparse.budget_tokens;
  }
  return Generator::Create(model_dir, options);
}

// The request the flags describe: --prompt_ids, else --prompt tokenized as the server does.
absl::StatusOr<GenerationRequest> RequestFromFlags(const Tokenizer& tokenizer,
                                                   const SparseRequestOptions& sparse) {
  GenerationRequest req;
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    ASSIGN_OR_RETURN(req.prompt, ParseTokenIds("prompt_ids", absl::GetFlag(FLAGS_prompt_ids)));
  } else {
    EncodeOptions options;
    options.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
    options.single_bos = true;
    ASSIGN_OR_RETURN(req.prompt, tokenizer.Encode(absl::GetFlag(FLAGS_prompt), options));
  }
  ASSIGN_OR_RETURN(req.stopping.stop_token_ids,
                   ParseTokenIds("stop_token_ids", absl::GetFlag(FLAGS_stop_token_ids)));
  req.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  req.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  req.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  req.sampling.min_p = absl::GetFlag(FLAGS_min_p);
  req.sampling.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  req.sampling.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  req.sampling.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  if (absl::GetFlag(FLAGS_seed) >= 0) req.sampling.seed = absl::GetFlag(FLAGS_seed);
  req.sampling.logprobs = absl::GetFlag(FLAGS_logprobs);
  req.stopping.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  req.stopping.stop = absl::GetFlag(FLAGS_stop);
  req.stopping.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  req.sparse = sparse;
  return req;
}

// Runs the request to its end, streaming its text to stdout, then its logprobs and a summary
// line (time to first token, decode rate, what the KV cache did) to stderr.
absl::Status RunToEnd(Generator& gen, GenerationRequest req, const std::string& model_dir) {
  const size_t prompt_tokens = req.prompt.size();
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(gen.Add(std::move(req)).status());
  std::vector<SequenceOutput> outputs;
  std::vector<SampledToken> logprobs;
  size_t completion_tokens = 0;
  FinishReason finish = FinishReason::kNone;
  std::optional<KvStats> kv_stats;
  double first_token_s = 0;
  while (gen.HasWork()) {
    outputs.clear();
    RETURN_IF_ERROR(gen.Step(&outputs));
    for (SequenceOutput& o : outputs) {
      if (completion_tokens == 0 && !o.tokens.empty()) {
        first_token_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      completion_tokens += o.tokens.size();
      std::fwrite(o.text.data(), 1, o.text.size(), stdout);
      std::fflush(stdout);
      for (SampledToken& t : o.logprobs) logprobs.push_back(std::move(t));
      finish = o.finish;
      if (o.kv_stats.has_value()) kv_stats = o.kv_stats;
    }
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n");
  std::fflush(stdout);
  PrintLogprobs(logprobs);
  std::cerr << absl::StrFormat(
      "[%s] prompt_tokens=%d completion_tokens=%d finish=%s ttft=%.1fms decode=%.1f tok/s\n",
      model_dir, prompt_tokens, completion_tokens, FinishReasonName(finish), first_token_s * 1e3,
      completion_tokens > 1 ? (completion_tokens - 1) / (total_s - first_token_s) : 0.0);
  if (kv_stats.has_value()) {
    std::cerr << absl::StrFormat("[%s] %s\n", model_dir, FormatKvStats(*kv_stats));
  }
  return absl::OkStatus();
}

}  // namespace

int GenerateOffline() {
  std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    auto dir = EnsureDefaultModel();
    if (!dir.ok()) return Fail(dir.status());
    model_dir = *dir;
  }
  auto sparse = SparseFlags();
  if (!sparse.ok()) return Fail(sparse.status());
  auto gen = CreateGenerator(model_dir, *sparse);
  if (!gen.ok()) return Fail(gen.status());
  absl::StatusOr<GenerationRequest> req = RequestFromFlags((*gen)->tokenizer(), *sparse);
  if (!req.ok()) return Fail(req.status());
  if (absl::Status s = RunToEnd(**gen, *std::move(req), model_dir); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace specula
