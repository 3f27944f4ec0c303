#include "tools/cli/cli_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(bool, offline, false, "run the engine in this process instead of calling a server");
ABSL_FLAG(std::string, server, "127.0.0.1:50051", "server address HOST:PORT (not with --offline)");
ABSL_FLAG(bool, tls, false, "connect over TLS, trusting the system's CAs (implied by --ca_file)");
ABSL_FLAG(std::string, ca_file, "", "PEM CA bundle that signs the server's certificate (TLS)");
ABSL_FLAG(std::string, cert_file, "",
          "PEM client certificate chain, for servers that require one (mutual TLS)");
ABSL_FLAG(std::string, key_file, "", "PEM private key of --cert_file");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line (not blank, not a # comment) is the bearer token to send");
ABSL_FLAG(double, timeout, 0, "deadline of the call in seconds (0 = none; not with --offline)");
ABSL_FLAG(std::string, model, "",
          "--offline: Hugging Face model directory (default: the embedded tiny model, generated "
          "on demand)");
ABSL_FLAG(std::string, prompt, "", "prompt text (generate, tokenize)");
ABSL_FLAG(std::string, prompt_ids, "",
          "comma-separated token ids: the prompt of generate instead of --prompt, or the ids "
          "detokenize turns into text");
ABSL_FLAG(bool, add_special_tokens, true, "let the tokenizer add BOS etc. to --prompt");
ABSL_FLAG(bool, skip_special_tokens, false, "detokenize: leave special tokens out of the text");
ABSL_FLAG(std::string, request_id, "", "request id for the server's logs (default: its own)");
ABSL_FLAG(std::string, session_id, "",
          "generate: the conversation whose KV the server keeps between turns; "
          "delete-session: the session to free");
ABSL_FLAG(int32_t, max_tokens, 64, "most tokens to generate");
ABSL_FLAG(float, temperature, 0.0f, "0 = greedy");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass");
ABSL_FLAG(int32_t, top_k, 0, "top-k (0 = off)");
ABSL_FLAG(float, min_p, 0.0f, "min-p");
ABSL_FLAG(float, repetition_penalty, 1.0f, "HF repetition penalty (1 = off)");
ABSL_FLAG(float, frequency_penalty, 0.0f, "OpenAI frequency penalty in [-2, 2]");
ABSL_FLAG(float, presence_penalty, 0.0f, "OpenAI presence penalty in [-2, 2]");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (-1 = random)");
ABSL_FLAG(int32_t, logprobs, -1,
          "print each token's logprob and this many alternatives on stderr (-1 = off)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings (comma-separated)");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {}, "token ids that stop (comma-separated)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating after EOS");
ABSL_FLAG(std::string, sparse_mode, "default",
          "KV cache attention: default (the server decides), dense or sparse");
ABSL_FLAG(int64_t, budget_tokens, 0,
          "sparse: selected tokens per layer and KV head (0 = the server's sparse.budget_tokens)");
ABSL_FLAG(std::string, service, "", "health: the service to check (\"\" = the whole server)");
ABSL_FLAG(int32_t, threads, 0, "--offline: CPU threads (0 = all cores)");
ABSL_FLAG(int64_t, kv_cache_tokens, 65536, "--offline: KV cache capacity in token positions");
ABSL_FLAG(int32_t, page_size, 16, "--offline: tokens per KV page");

namespace specula {

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(absl::string_view flag,
                                                   const std::vector<std::string>& parts) {
  std::vector<int32_t> ids;
  ids.reserve(parts.size());
  for (const std::string& part : parts) {
    int32_t id;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad token id '", part, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(absl::string_view flag, absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) return std::vector<int32_t>{};
  return ParseTokenIds(flag, std::vector<std::string>(absl::StrSplit(text, ',')));
}

absl::StatusOr<SparseRequestOptions> SparseFlags() {
  SparseRequestOptions out;
  const std::string mode = absl::GetFlag(FLAGS_sparse_mode);
  if (mode == "default") {
    out.mode = SparseMode::kDefault;
  } else if (mode == "dense") {
    out.mode = SparseMode::kDense;
  } else if (mode == "sparse") {
    out.mode = SparseMode::kSparse;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--sparse-mode: must be default, dense or sparse, got '", mode, "'"));
  }
  out.budget_tokens = absl::GetFlag(FLAGS_budget_tokens);
  if (out.budget_tokens < 0 || out.budget_tokens > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--budget-tokens: must be in [0, 4294967295] (0 = the server's), got ", out.budget_tokens));
  }
  return out;
}

std::string FormatKvStats(const KvStats& k) {
  if (!k.sparse) return "kv_stats sparse=false";
  return absl::StrFormat(
      "kv_stats sparse=true budget_tokens=%d pages_hit=%d pages_missed=%d pages_late=%d "
      "pages_corrected=%d hit_rate=%.3f bytes_prefetched=%d bytes_fetched=%d stall=%.2fms",
      k.budget_tokens, k.pages_hit, k.pages_missed, k.pages_late, k.pages_corrected, k.hit_rate(),
      k.bytes_prefetched, k.bytes_fetched, k.stall_seconds * 1e3);
}

}  // namespace specula
