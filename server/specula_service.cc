#include "server/specula_service.h"

#include <limits>

#include "absl/strings/str_format.h"
#include "engine/common/log.h"
#include "server/chat_proto.h"
#include "server/request_parse.h"
#include "server/status.h"

namespace specula {
namespace {

// Finishes the call on `reactor` (the context's default reactor, taken once per call).
grpc::ServerUnaryReactor* Answer(absl::string_view method, grpc::ServerUnaryReactor* reactor,
                                 const absl::Status& status) {
  if (!status.ok()) {
    Log(LogLevel::kInfo, "call_rejected",
        {{"method", method},
         {"status", StatusCodeName(status.code())},
         {"error", status.message()}});
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Parses the request, runs `body` on it and serializes what it fills in, in one status.
template <typename Request, typename Response, typename Body>
absl::Status Serve(const CallEnv& env, const grpc::ByteBuffer& bytes, grpc::ByteBuffer* out,
                   Body body) {
  Request request;
  if (absl::Status s = ParseRequest(bytes, &request); !s.ok()) return s;
  if (absl::Status s = CheckAdmission(env, request); !s.ok()) return s;
  Response response;
  if (absl::Status s = body(request, &response); !s.ok()) return s;
  return SerializeResponse(response, out);
}

// For messages: the rendered prompt (as Generate would render it), its tokenizing options and the
// field errors name.
absl::StatusOr<RenderedChat> RenderTokenizeMessages(const ChatModel* chat,
                                                    const v1::TokenizeRequest& request) {
  if (!request.text().empty()) {
    return absl::InvalidArgumentError("set exactly one of text and messages, not both");
  }
  if (chat == nullptr || !chat->has_template()) return NoChatTemplateError();
  absl::StatusOr<ChatRequest> converted = ToChatRequest(
      request.messages(), request.tools(), request.tool_choice(), request.chat_template_kwargs());
  if (!converted.ok()) return converted.status();
  converted->add_generation_prompt =
      !request.has_add_generation_prompt() || request.add_generation_prompt();
  converted->control_tokens_in_content = request.control_tokens_in_content();
  return chat->Render(*converted);
}

absl::Status TokenizeText(const Tokenizer& tokenizer, const ChatModel* chat,
                          const TotalTokenLimits& limits, const v1::TokenizeRequest& request,
                          v1::TokenizeResponse* response) {
  EncodeOptions options = EncodeOptionsOf(request);
  std::string_view text = request.text();
  if (!request.messages().empty()) {
    absl::StatusOr<RenderedChat> rendered = RenderTokenizeMessages(chat, request);
    if (!rendered.ok()) return rendered.status();
    response->set_prompt_text(std::move(rendered->prompt_text));
    text = response->prompt_text();
    options = EncodeOptions();
    options.add_special_tokens = false;  // as Generate tokenizes a rendered conversation
    options.plain_ranges = std::move(rendered->plain_ranges);
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      EncodePrompt(tokenizer, absl::string_view(text.data(), text.size()),
                   request.messages().empty() ? "text" : "messages", options, limits);
  if (!ids.ok()) return ids.status();
  for (int32_t id : *ids) {
    response->add_token_ids(static_cast<uint32_t>(id));
    response->add_tokens(tokenizer.IdToToken(id));
  }
  return absl::OkStatus();
}

absl::Status DetokenizeIds(const Tokenizer& tokenizer, const v1::DetokenizeRequest& request,
                           v1::DetokenizeResponse* response) {
  std::vector<int32_t> ids;
  ids.reserve(request.token_ids_size());
  for (int i = 0; i < request.token_ids_size(); ++i) {
    const uint32_t id = request.token_ids(i);
    if (id >= static_cast<uint64_t>(tokenizer.vocab_size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token_ids[%d] = %d is outside the vocabulary [0, %d)", i, id, tokenizer.vocab_size()));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  absl::StatusOr<std::string> text = tokenizer.Decode(ids, request.skip_special_tokens());
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token_ids: ", text.status().message()));
  }
  response->set_text(*std::move(text));
  return absl::OkStatus();
}

constexpr uint32_t kDefaultSessionPage = 100;
constexpr uint32_t kMaxSessionPage = 1000;

void AddSessions(const PrefixCache::SessionPage& page, v1::ListSessionsResponse* response) {
  for (const SessionInfo& s : page.sessions) {
    v1::Session* out = response->add_sessions();
    out->set_session_id(s.id);
    out->set_cached_tokens(static_cast<uint64_t>(s.tokens));
    (s.in_host ? out->set_host_bytes(static_cast<uint64_t>(s.bytes))
               : out->set_kv_cache_bytes(static_cast<uint64_t>(s.bytes)));
    out->set_running(s.running);
    if (s.last_use != absl::Time()) out->set_last_use_unix_ms(absl::ToUnixMillis(s.last_use));
  }
  // The token is the last id of the page: ids are printable ASCII, so it travels as it is.
  if (page.more && !page.sessions.empty()) {
    response->set_next_page_token(page.sessions.back().id);
  }
}

// Auth, parsing and admission of a unary call, on gRPC's thread; the request when they pass,
// else the call is answered.
template <typename Request>
std::shared_ptr<Request> AdmitUnary(const char* method, const CallEnv& env,
                                    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* bytes,
                                    grpc::ServerUnaryReactor* reactor) {
  absl::Status s = CheckAuth(env, *ctx);
  auto request = std::make_shared<Request>();
  if (s.ok()) s = ParseRequest(*bytes, request.get());
  if (s.ok()) s = CheckAdmission(env, *request);
  if (s.ok()) return request;
  Answer(method, reactor, s);
  return nullptr;
}

}  // namespace

// Session calls wait for the engine thread without holding a thread: the engine answers them
// between steps (Engine::ListSessions / DeleteSession).
grpc::ServerUnaryReactor* SpeculaService::ListSessions(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto parsed = AdmitUnary<v1::ListSessionsRequest>("ListSessions", *env_, ctx, request, reactor);
  if (parsed == nullptr) return reactor;
  if (!parsed->page_token().empty()) {
    if (absl::Status s = ValidateSessionId(parsed->page_token()); !s.ok()) {
      return Answer("ListSessions", reactor,
                    absl::InvalidArgumentError("page_token: not a token this server returned"));
    }
  }
  const uint32_t size = parsed->page_size() == 0 ? kDefaultSessionPage
                                                 : std::min(parsed->page_size(), kMaxSessionPage);
  env_->engine->ListSessions(parsed->page_token(), size,
                             [reactor, response](absl::StatusOr<PrefixCache::SessionPage> page) {
                               v1::ListSessionsResponse out;
                               absl::Status s = page.status();
                               if (s.ok()) AddSessions(*page, &out);
                               if (s.ok()) s = SerializeResponse(out, response);
                               Answer("ListSessions", reactor, s);
                             });
  return reactor;
}

grpc::ServerUnaryReactor* SpeculaService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto parsed = AdmitUnary<v1::DeleteSessionRequest>("DeleteSession", *env_, ctx, request, reactor);
  if (parsed == nullptr) return reactor;
  if (absl::Status s = ValidateSessionId(parsed->session_id()); !s.ok()) {
    return Answer("DeleteSession", reactor, s);
  }
  env_->engine->DeleteSession(parsed->session_id(), [reactor, response](absl::Status s) {
    if (s.ok()) s = SerializeResponse(v1::DeleteSessionResponse(), response);
    Answer("DeleteSession", reactor, s);
  });
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SpeculaService::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return GenerateCall::Start(ctx, request, env_);
}

grpc::ServerUnaryReactor* SpeculaService::Tokenize(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckAuth(*env_, *ctx); !s.ok()) return Answer("Tokenize", reactor, s);
  // Parsed and admitted here, so a refused call takes no place in the tokenizer queue.
  auto parsed = std::make_shared<v1::TokenizeRequest>();
  if (absl::Status s = ParseRequest(*request, parsed.get()); !s.ok()) {
    return Answer("Tokenize", reactor, s);
  }
  if (absl::Status s = CheckAdmission(*env_, *parsed); !s.ok()) {
    return Answer("Tokenize", reactor, s);
  }
  const Tokenizer* tokenizer = &env_->engine->generator().tokenizer();
  auto run = [this, ctx, reactor, parsed, response, tokenizer](bool queued) {
    // A client that left while the text waited in the queue costs no tokenizing.
    if (queued && ClientGone(*ctx)) {
      return Answer("Tokenize", reactor, ClientGoneStatus(*ctx));
    }
    v1::TokenizeResponse out;
    absl::Status s = TokenizeText(*tokenizer, env_->chat, env_->max_total_tokens, *parsed, &out);
    if (s.ok()) s = SerializeResponse(out, response);
    return Answer("Tokenize", reactor, s);
  };
  // Long texts leave gRPC's thread (the response buffer lives until Finish).
  if (env_->tokenizer_queue == nullptr || request->Length() <= env_->inline_tokenize_bytes) {
    return run(/*queued=*/false);
  }
  absl::Status refusal;
  if (!PostTokenization(
          *env_, [run] { run(/*queued=*/true); }, &refusal)) {
    return Answer("Tokenize", reactor, refusal);
  }
  return reactor;
}

grpc::ServerUnaryReactor* SpeculaService::Detokenize(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  if (absl::Status s = CheckAuth(*env_, *ctx); !s.ok()) {
    return Answer("Detokenize", ctx->DefaultReactor(), s);
  }
  const Tokenizer& tokenizer = env_->engine->generator().tokenizer();
  return Answer("Detokenize", ctx->DefaultReactor(),
                Serve<v1::DetokenizeRequest, v1::DetokenizeResponse>(
                    *env_, *request, response,
                    [&](const v1::DetokenizeRequest& r, v1::DetokenizeResponse* out) {
                      return DetokenizeIds(tokenizer, r, out);
                    }));
}

grpc::ServerUnaryReactor* SpeculaService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  if (absl::Status s = CheckAuth(*env_, *ctx); !s.ok()) {
    return Answer("GetModelInfo", ctx->DefaultReactor(), s);
  }
  return Answer(
      "GetModelInfo", ctx->DefaultReactor(),
      Serve<v1::GetModelInfoRequest, v1::ModelInfo>(
          *env_, *request, response, [this](const v1::GetModelInfoRequest&, v1::ModelInfo* out) {
            *out = model_info_;
            return absl::OkStatus();
          }));
}

}  // namespace specula
