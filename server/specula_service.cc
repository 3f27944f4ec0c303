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
absl::StatusOr<std::string> RenderTokenizeMessages(const ChatModel* chat,
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
  absl::StatusOr<RenderedChat> rendered = chat->Render(*converted);
  if (!rendered.ok()) return rendered.status();
  return std::move(rendered->prompt_text);
}

absl::Status TokenizeText(const Tokenizer& tokenizer, const ChatModel* chat,
                          const TotalTokenLimits& limits, const v1::TokenizeRequest& request,
                          v1::TokenizeResponse* response) {
  EncodeOptions options = EncodeOptionsOf(request);
  std::string_view text = request.text();
  if (!request.messages().empty()) {
    absl::StatusOr<std::string> rendered = RenderTokenizeMessages(chat, request);
    if (!rendered.ok()) return rendered.status();
    response->set_prompt_text(*std::move(rendered));
    text = response->prompt_text();
    options = EncodeOptions();
    options.add_special_tokens = false;  // as Generate tokenizes a rendered conversation
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

absl::Status ListSessionsOf(Engine& engine, v1::ListSessionsResponse* response) {
  absl::StatusOr<std::vector<SessionInfo>> sessions = engine.ListSessions();
  if (!sessions.ok()) return sessions.status();
  for (const SessionInfo& s : *sessions) {
    v1::Session* out = response->add_sessions();
    out->set_session_id(s.id);
    out->set_cached_tokens(static_cast<uint64_t>(s.tokens));
    (s.in_host ? out->set_host_bytes(static_cast<uint64_t>(s.bytes))
              : out->set_kv_cache_bytes(static_cast<uint64_t>(s.bytes)));
    out->set_running(s.running);
    if (s.last_use != absl::Time()) out->set_last_use_unix_ms(absl::ToUnixMillis(s.last_use));
  }
  return absl::OkStatus();
}

// Parses and admits a unary request here, then runs `body` on the tokenizer queue (it waits for
// the engine thread, which must not hold one of gRPC's threads) and answers from there.
template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* ServeOffThread(const char* method, CallEnv& env,
                                         grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* bytes, grpc::ByteBuffer* out,
                                         Body body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = CheckAuth(env, *ctx); !s.ok()) return Answer(method, reactor, s);
  auto request = std::make_shared<Request>();
  if (absl::Status s = ParseRequest(*bytes, request.get()); !s.ok()) {
    return Answer(method, reactor, s);
  }
  if (absl::Status s = CheckAdmission(env, *request); !s.ok()) return Answer(method, reactor, s);
  auto run = [method, reactor, request, out, body] {
    Response response;
    absl::Status s = body(*request, &response);
    if (s.ok()) s = SerializeResponse(response, out);
    Answer(method, reactor, s);
  };
  if (env.tokenizer_queue == nullptr) {
    run();
    return reactor;
  }
  absl::Status refusal;
  if (!PostTokenization(env, run, &refusal)) return Answer(method, reactor, refusal);
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* SpeculaService::ListSessions(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  Engine* engine = env_->engine;
  return ServeOffThread<v1::ListSessionsRequest, v1::ListSessionsResponse>(
      "ListSessions", *env_, ctx, request, response,
      [engine](const v1::ListSessionsRequest&, v1::ListSessionsResponse* out) {
        return ListSessionsOf(*engine, out);
      });
}

grpc::ServerUnaryReactor* SpeculaService::DeleteSession(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  Engine* engine = env_->engine;
  return ServeOffThread<v1::DeleteSessionRequest, v1::DeleteSessionResponse>(
      "DeleteSession", *env_, ctx, request, response,
      [engine](const v1::DeleteSessionRequest& r, v1::DeleteSessionResponse*) {
        if (absl::Status s = ValidateSessionId(r.session_id()); !s.ok()) return s;
        return engine->DeleteSession(r.session_id());
      });
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
