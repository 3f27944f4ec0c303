#include "tools/cli/server_commands.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "specula/v1/specula.grpc.pb.h"
#include "tools/cli/cli_flags.h"
#include "tools/cli/connection.h"

namespace specula {
namespace {

namespace pb = ::specula::v1;
namespace health = ::grpc::health::v1;

int ExitCode(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return 0;
  return code == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int Fail(const absl::Status& s) {
  std::cerr << "specula-cli: " << s << "\n";
  return ExitCode(s.code());
}

// gRPC and absl share the numbering of status codes.
int Fail(const grpc::Status& s) {
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  std::cerr << "specula-cli: " << absl::StatusCodeToString(code) << ": " << s.error_message()
            << " (server " << absl::GetFlag(FLAGS_server) << ")\n";
  return ExitCode(code);
}

// Every flag is sent explicitly: the CLI's defaults (greedy, 64 tokens) differ from the server's.
absl::StatusOr<pb::GenerateRequest> BuildGenerateRequest() {
  pb::GenerateRequest req;
  req.set_request_id(absl::GetFlag(FLAGS_request_id));
  req.set_session_id(absl::GetFlag(FLAGS_session_id));
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    auto ids = ParseTokenIds("prompt_ids", absl::GetFlag(FLAGS_prompt_ids));
    if (!ids.ok()) return ids.status();
    req.mutable_prompt_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  } else {
    req.set_prompt(absl::GetFlag(FLAGS_prompt));
    req.set_add_special_tokens(absl::GetFlag(FLAGS_add_special_tokens));
  }
  pb::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(absl::GetFlag(FLAGS_temperature));
  s->set_top_p(absl::GetFlag(FLAGS_top_p));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_min_p(absl::GetFlag(FLAGS_min_p));
  s->set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  s->set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  s->set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  if (absl::GetFlag(FLAGS_seed) >= 0) s->set_seed(absl::GetFlag(FLAGS_seed));
  if (absl::GetFlag(FLAGS_logprobs) >= 0) s->set_logprobs(absl::GetFlag(FLAGS_logprobs));

  auto stop_ids = ParseTokenIds("stop_token_ids", absl::GetFlag(FLAGS_stop_token_ids));
  if (!stop_ids.ok()) return stop_ids.status();
  pb::StoppingCriteria* st = req.mutable_stopping();
  st->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) st->add_stop(stop);
  st->mutable_stop_token_ids()->Add(stop_ids->begin(), stop_ids->end());
  st->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));

  auto sparse = SparseFlags();
  if (!sparse.ok()) return sparse.status();
  switch (sparse->mode) {
    case SparseMode::kDefault:
      break;
    case SparseMode::kDense:
      req.mutable_sparse()->set_mode(pb::SPARSE_MODE_DENSE);
      break;
    case SparseMode::kSparse:
      req.mutable_sparse()->set_mode(pb::SPARSE_MODE_SPARSE);
      break;
  }
  if (sparse->budget_tokens > 0) {
    req.mutable_sparse()->set_budget_tokens(static_cast<uint32_t>(sparse->budget_tokens));
  }
  return req;
}

// Vocabulary strings may hold spaces and control bytes; quoting keeps one token per line.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

// Logprobs go to stderr so that stdout stays exactly the generated text.
void PrintRemoteLogprobs(const std::vector<pb::TokenLogprobs>& logprobs) {
  for (const pb::TokenLogprobs& t : logprobs) {
    std::cerr << absl::StrFormat("logprob token=%d %.4f", t.token_id(), t.logprob());
    for (const pb::TokenLogprob& alt : t.top()) {
      std::cerr << absl::StrFormat(" %d:%.4f", alt.token_id(), alt.logprob());
    }
    std::cerr << "\n";
  }
}

KvStats KvStatsOf(const pb::KvStats& proto) {
  KvStats k;
  k.sparse = proto.sparse();
  k.budget_tokens = static_cast<int64_t>(proto.budget_tokens());
  k.pages_hit = static_cast<int64_t>(proto.pages_hit());
  k.pages_missed = static_cast<int64_t>(proto.pages_missed());
  k.pages_late = static_cast<int64_t>(proto.pages_late());
  k.pages_corrected = static_cast<int64_t>(proto.pages_corrected());
  k.bytes_prefetched = static_cast<int64_t>(proto.bytes_prefetched());
  k.bytes_fetched = static_cast<int64_t>(proto.bytes_fetched());
  k.stall_seconds = proto.stall_seconds();
  return k;
}

}  // namespace

int GenerateRemote() {
  auto req = BuildGenerateRequest();
  if (!req.ok()) return Fail(req.status());
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto stub = pb::Specula::NewStub(conn->channel);
  auto ctx = conn->NewContext();

  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader =
      stub->Generate(ctx.get(), *req);
  pb::GenerateResponse msg;
  std::vector<pb::TokenLogprobs> logprobs;
  pb::FinishReason finish = pb::FINISH_REASON_UNSPECIFIED;
  pb::Usage usage;
  std::optional<pb::KvStats> kv_stats;
  size_t completion_tokens = 0;
  double first_token_s = 0;
  while (reader->Read(&msg)) {
    if (completion_tokens == 0 && msg.token_ids_size() > 0) {
      first_token_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    completion_tokens += msg.token_ids_size();
    std::fwrite(msg.text().data(), 1, msg.text().size(), stdout);
    std::fflush(stdout);
    for (pb::TokenLogprobs& t : *msg.mutable_logprobs()) logprobs.push_back(std::move(t));
    if (msg.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) finish = msg.finish_reason();
    if (msg.has_usage()) usage = msg.usage();
    if (msg.has_kv_stats()) kv_stats = msg.kv_stats();
  }
  const grpc::Status status = reader->Finish();
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The newline ends the text even when the stream broke, so the error starts on its own line.
  std::printf("\n");
  std::fflush(stdout);
  if (!status.ok()) return Fail(status);

  PrintRemoteLogprobs(logprobs);
  // Over the whole call: the server may coalesce tokens into few messages, so a rate over the
  // gaps between messages would read as arbitrarily fast.
  std::cerr << absl::StrFormat(
      "[%s] prompt_tokens=%d cached_prompt_tokens=%d completion_tokens=%d finish=%s "
      "ttft=%.1fms total=%.1fms (%.1f tok/s)\n",
      absl::GetFlag(FLAGS_server), usage.prompt_tokens(), usage.cached_prompt_tokens(),
      usage.completion_tokens(),
      pb::FinishReason_Name(finish), first_token_s * 1e3, total_s * 1e3,
      total_s > 0 ? completion_tokens / total_s : 0.0);
  if (kv_stats.has_value()) {
    std::cerr << absl::StrFormat("[%s] %s\n", absl::GetFlag(FLAGS_server),
                                 FormatKvStats(KvStatsOf(*kv_stats)));
  }
  return 0;
}

int TokenizeRemote() {
  pb::TokenizeRequest req;
  req.set_text(absl::GetFlag(FLAGS_prompt));
  req.set_add_special_tokens(absl::GetFlag(FLAGS_add_special_tokens));
  pb::TokenizeResponse resp;
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto ctx = conn->NewContext();
  const grpc::Status status = pb::Specula::NewStub(conn->channel)->Tokenize(ctx.get(), req, &resp);
  if (!status.ok()) return Fail(status);
  std::cout << absl::StrJoin(resp.token_ids(), ",") << "\n";
  for (int i = 0; i < resp.token_ids_size(); ++i) {
    std::cout << resp.token_ids(i) << "\t"
              << (i < resp.tokens_size() ? Quote(resp.tokens(i)) : std::string("?")) << "\n";
  }
  return 0;
}

int DetokenizeRemote() {
  auto ids = ParseTokenIds("prompt_ids", absl::GetFlag(FLAGS_prompt_ids));
  if (!ids.ok()) return Fail(ids.status());
  pb::DetokenizeRequest req;
  req.mutable_token_ids()->Add(ids->begin(), ids->end());
  req.set_skip_special_tokens(absl::GetFlag(FLAGS_skip_special_tokens));
  pb::DetokenizeResponse resp;
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto ctx = conn->NewContext();
  const grpc::Status status = pb::Specula::NewStub(conn->channel)->Detokenize(ctx.get(), req, &resp);
  if (!status.ok()) return Fail(status);
  std::cout << resp.text() << "\n";
  return 0;
}

int InfoRemote() {
  pb::ModelInfo info;
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto ctx = conn->NewContext();
  const grpc::Status status =
      pb::Specula::NewStub(conn->channel)->GetModelInfo(ctx.get(), pb::GetModelInfoRequest(), &info);
  if (!status.ok()) return Fail(status);
  const pb::ServerLimits& l = info.limits();
  const pb::SparseConfig& sp = info.sparse();
  std::cout << absl::StrFormat(
      "model_path:                %s\n"
      "architecture:              %s\n"
      "num_layers:                %d\n"
      "num_attention_heads:       %d\n"
      "num_key_value_heads:       %d\n"
      "head_dim:                  %d\n"
      "hidden_size:               %d\n"
      "vocab_size:                %d\n"
      "max_context_tokens:        %d\n"
      "dtype:                     %s\n"
      "device:                    %s\n"
      "eos_token_ids:             %s\n"
      "max_running_requests:      %d\n"
      "max_waiting_requests:      %d\n"
      "max_receive_message_bytes: %d\n"
      "kv_cache_tokens:           %d\n"
      "prefill_chunk_tokens:      %d\n"
      "sparse_enabled:            %s\n"
      "sparse_budget_tokens:      %d\n"
      "sparse_sink_tokens:        %d\n"
      "sparse_recent_tokens:      %d\n"
      "sparse_selector:           %s\n"
      "sparse_speculation:        %s\n"
      "sparse_miss_policy:        %s\n"
      "sparse_miss_correction:    %g\n"
      "sparse_min_context_tokens: %d\n"
      "sparse_page_size:          %d\n",
      info.model_path(), info.architecture(), info.num_layers(), info.num_attention_heads(),
      info.num_key_value_heads(), info.head_dim(), info.hidden_size(), info.vocab_size(),
      info.max_context_tokens(), info.dtype(), info.device(),
      absl::StrJoin(info.eos_token_ids(), ","), l.max_running_requests(), l.max_waiting_requests(),
      l.max_receive_message_bytes(), l.kv_cache_tokens(), l.prefill_chunk_tokens(),
      sp.enabled() ? "true" : "false", sp.budget_tokens(), sp.sink_tokens(), sp.recent_tokens(),
      sp.selector(), sp.speculation(), sp.miss_policy(), sp.miss_correction(),
      sp.min_context_tokens(), sp.page_size());
  return 0;
}

// Every page, one after the other.
int ListSessionsRemote() {
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto stub = pb::Specula::NewStub(conn->channel);
  std::cout << "session_id\tcached_tokens\thost_bytes\tkv_cache_bytes\trunning\tidle_s\n";
  pb::ListSessionsRequest req;
  req.set_page_size(1000);
  do {
    pb::ListSessionsResponse resp;
    auto ctx = conn->NewContext();
    const grpc::Status status = stub->ListSessions(ctx.get(), req, &resp);
    if (!status.ok()) return Fail(status);
    const int64_t now_ms = absl::ToUnixMillis(absl::Now());
    for (const pb::Session& s : resp.sessions()) {
      std::cout << absl::StrFormat(
          "%s\t%d\t%d\t%d\t%s\t%.1f\n", s.session_id(), s.cached_tokens(), s.host_bytes(),
          s.kv_cache_bytes(), s.running() ? "yes" : "no",
          s.last_use_unix_ms() > 0 ? (now_ms - s.last_use_unix_ms()) / 1e3 : 0.0);
    }
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return 0;
}

int DeleteSessionRemote() {
  pb::DeleteSessionRequest req;
  req.set_session_id(absl::GetFlag(FLAGS_session_id));
  pb::DeleteSessionResponse resp;
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto ctx = conn->NewContext();
  const grpc::Status status =
      pb::Specula::NewStub(conn->channel)->DeleteSession(ctx.get(), req, &resp);
  if (!status.ok()) return Fail(status);
  std::cout << "deleted " << req.session_id() << "\n";
  return 0;
}

int HealthRemote() {
  health::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  health::HealthCheckResponse resp;
  auto conn = Connect();
  if (!conn.ok()) return Fail(conn.status());
  auto ctx = conn->NewContext();
  const grpc::Status status = health::Health::NewStub(conn->channel)->Check(ctx.get(), req, &resp);
  if (!status.ok()) return Fail(status);
  std::cout << health::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return resp.status() == health::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace specula
