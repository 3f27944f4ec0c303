// specula-cli: the command-line client. `generate --offline` runs the engine in-process on a model
// directory and streams the text to stdout; statistics go to stderr.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/generate/generator.h"
#include "tools/default_model/default_model.h"

ABSL_FLAG(bool, offline, false, "run the engine in this process instead of calling a server");
ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (default: the embedded tiny model, generated on demand)");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(bool, add_special_tokens, true, "let the tokenizer add BOS etc. to --prompt");
ABSL_FLAG(int32_t, max_tokens, 64, "most tokens to generate");
ABSL_FLAG(float, temperature, 0.0f, "0 = greedy");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass");
ABSL_FLAG(int32_t, top_k, 0, "top-k (0 = off)");
ABSL_FLAG(float, min_p, 0.0f, "min-p");
ABSL_FLAG(float, repetition_penalty, 1.0f, "HF repetition penalty (1 = off)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (-1 = random)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings (comma-separated)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating after EOS");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0 = all cores)");
ABSL_FLAG(int64_t, kv_cache_tokens, 65536, "KV cache capacity in token positions");
ABSL_FLAG(int32_t, page_size, 16, "tokens per KV page");

namespace specula {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "specula-cli: " << s << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int GenerateOffline() {
  std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    auto dir = EnsureDefaultModel();
    if (!dir.ok()) return Fail(dir.status());
    model_dir = *dir;
  }
  GeneratorOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.kv_cache_tokens = absl::GetFlag(FLAGS_kv_cache_tokens);
  options.page_size = absl::GetFlag(FLAGS_page_size);
  auto gen = Generator::Create(model_dir, options);
  if (!gen.ok()) return Fail(gen.status());

  GenerationRequest req;
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',')) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("--prompt_ids: bad id '", part, "'")));
      }
      req.prompt.push_back(id);
    }
  } else {
    auto ids = (*gen)->tokenizer().Encode(absl::GetFlag(FLAGS_prompt),
                                          absl::GetFlag(FLAGS_add_special_tokens));
    if (!ids.ok()) return Fail(ids.status());
    req.prompt = std::move(*ids);
  }
  req.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  req.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  req.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  req.sampling.min_p = absl::GetFlag(FLAGS_min_p);
  req.sampling.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  if (absl::GetFlag(FLAGS_seed) >= 0) req.sampling.seed = absl::GetFlag(FLAGS_seed);
  req.stopping.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  req.stopping.stop = absl::GetFlag(FLAGS_stop);
  req.stopping.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  const size_t prompt_tokens = req.prompt.size();

  const auto start = std::chrono::steady_clock::now();
  auto id = (*gen)->Add(std::move(req));
  if (!id.ok()) return Fail(id.status());
  std::vector<SequenceOutput> outputs;
  size_t completion_tokens = 0;
  FinishReason finish = FinishReason::kNone;
  double first_token_s = 0;
  while ((*gen)->HasWork()) {
    outputs.clear();
    if (absl::Status s = (*gen)->Step(&outputs); !s.ok()) return Fail(s);
    for (const SequenceOutput& o : outputs) {
      if (completion_tokens == 0 && !o.tokens.empty()) {
        first_token_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      completion_tokens += o.tokens.size();
      std::fwrite(o.text.data(), 1, o.text.size(), stdout);
      std::fflush(stdout);
      finish = o.finish;
    }
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n");
  std::cerr << absl::StrFormat(
      "[%s] prompt_tokens=%d completion_tokens=%d finish=%s ttft=%.1fms decode=%.1f tok/s\n",
      model_dir, prompt_tokens, completion_tokens, FinishReasonName(finish), first_token_s * 1e3,
      completion_tokens > 1 ? (completion_tokens - 1) / (total_s - first_token_s) : 0.0);
  return 0;
}

}  // namespace
}  // namespace specula

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specula-cli generate --offline [--model DIR] --prompt TEXT [--max_tokens N] ...");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::cerr << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = args[1];
  if (command == "generate") {
    if (!absl::GetFlag(FLAGS_offline)) {
      std::cerr << "specula-cli: generate needs --offline until a server address is supported\n";
      return 2;
    }
    return specula::GenerateOffline();
  }
  std::cerr << "specula-cli: unknown command '" << command << "'\n"
            << absl::ProgramUsageMessage() << "\n";
  return 2;
}
