#include "server/openai_service.h"

#include <algorithm>

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/build_info.h"
#include "engine/common/log.h"
#include "server/request_convert.h"
#include "server/status.h"

namespace specula {
namespace {

// Whether `request` may use the API: authentication off, or an `authorization: Bearer` header
// with one of the tokens.
bool Authorized(const CallEnv& env, const HttpRequest& request) {
  if (env.auth == nullptr) return true;
  const std::string* header = request.header("authorization");
  return header != nullptr && env.auth->Allows(*header);
}

// One HTTP generation: parsed, rendered and tokenized on the tokenizer queue, submitted to the
// engine, and answered through the exchange as the engine produces (SSE) or at the end (JSON).
class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  OpenAiCall(CallEnv* env, const std::string* served_model, OpenAiEndpoint endpoint,
             const HttpRequest& request, std::shared_ptr<HttpExchange> exchange)
      : env_(env),
        served_model_(served_model),
        endpoint_(endpoint),
        body_(request.body),
        exchange_(std::move(exchange)) {
    if (const std::string* session = request.header(kSessionIdMetadata)) session_id_ = *session;
    if (const std::string* authorization = request.header("authorization")) {
      authorization_ = *authorization;
    }
    peer_ = request.peer;
  }

  void Start() {
    std::weak_ptr<OpenAiCall> weak = weak_from_this();
    exchange_->OnClientGone([weak] {
      if (auto call = weak.lock()) call->ClientGone();
    });
    if (env_->draining.load()) {
      return Reject(
          absl::UnavailableError("the server is shutting down; retry on another replica"));
    }
    absl::StatusOr<ClientLimiter::Lease> place =
        AcquireClientPlace(*env_, authorization_.empty() ? nullptr : &authorization_, peer_);
    if (!place.ok()) return Reject(place.status());
    client_place_ = *std::move(place);
    // As on gRPC: a small request is parsed, rendered and tokenized at once (well under a
    // millisecond, on the polling thread), a large one on the tokenizer queue, whose bound
    // (scheduler.max_tokenizing_requests) is for long prompts, not for every request.
    if (env_->tokenizer_queue == nullptr || body_.size() <= env_->inline_tokenize_bytes) {
      return SafePrepare();
    }
    absl::Status refusal;
    if (!PostTokenization(
            *env_, [self = shared_from_this()] { self->SafePrepare(); }, &refusal)) {
      Reject(refusal);
    }
  }

 private:
  void Reject(const OpenAiError& error, absl::StatusCode code) {
    client_place_.Reset();  // before the client can hear the refusal and send again
    if (env_->metrics) env_->metrics->RecordRejected(code);
    Log(LogLevel::kInfo, "request_rejected",
        {{"request_id", request_id_},
         {"status", StatusCodeName(code)},
         {"http_status", absl::StrCat(error.http_status)},
         {"error", error.message}});
    exchange_->Respond(OpenAiErrorResponse(error));
  }
  void Reject(const absl::Status& status) { Reject(OpenAiErrorFrom(status), status.code()); }

  bool Gone() {
    std::lock_guard lock(mu_);
    return gone_;
  }

  // A bug that throws answers 500 rather than ending the process (the worker threads and
  // libmicrohttpd's callbacks have no handler of their own).
  void SafePrepare() {
    try {
      Prepare();
    } catch (const std::exception& e) {
      Log(LogLevel::kError, "http_request_failed", {{"error", e.what()}});
      Reject(absl::InternalError("internal error while preparing the request"));
    }
  }

  // On the tokenizer queue, or inline for small bodies.
  void Prepare() {
    if (Gone()) return Reject(absl::CancelledError("the client went away"));
    OpenAiRequest parsed;
    if (std::optional<OpenAiError> e =
            ParseOpenAiRequest(endpoint_, body_, *served_model_, &parsed)) {
      return Reject(*e, e->http_status == 404 ? absl::StatusCode::kNotFound
                                              : absl::StatusCode::kInvalidArgument);
    }
    std::string().swap(body_);
    if (!session_id_.empty()) parsed.generate.set_session_id(session_id_);
    std::optional<ChatStream> chat;
    if (parsed.chat.has_value()) {
      if (env_->chat == nullptr || !env_->chat->has_template())
        return Reject(NoChatTemplateError());
      absl::StatusOr<RenderedChat> rendered = env_->chat->Render(*parsed.chat);
      if (!rendered.ok()) return Reject(rendered.status());
      parsed.generate.set_prompt(rendered->prompt_text);
      parsed.generate.set_add_special_tokens(false);  // the template wrote them
      chat.emplace(env_->chat->output_format(), *rendered);
    }
    const Tokenizer& tokenizer = env_->engine->generator().tokenizer();
    absl::StatusOr<EngineRequest> converted = ToEngineRequest(
        parsed.generate, tokenizer, env_->default_max_tokens, env_->max_total_tokens);
    if (!converted.ok()) return Reject(converted.status());
    request_id_ = converted->request_id;
    stream_mode_ = parsed.stream;
    answer_.emplace(
        parsed, request_id_,
        // A token's own bytes (SentencePiece's "▁" as a space, a byte-fallback token as its
        // byte), not a decode of it alone, which strips a leading space and turns a partial
        // UTF-8 sequence into U+FFFD: logprobs' "bytes" are for exactly those tokens.
        [&tokenizer](int32_t id) { return tokenizer.TokenBytes(id); },
        std::move(chat));
    Submit(*std::move(converted));
  }

  void Submit(EngineRequest request) {
    std::weak_ptr<OpenAiCall> weak = weak_from_this();
    SendExecutor* sender = env_->sender;
    stream_ = std::make_shared<RequestStream>([weak, sender] {
      sender->Post([weak] {
        if (auto call = weak.lock()) call->Drain();
      });
    });
    if (Gone()) return Reject(absl::CancelledError("the client went away"));
    absl::StatusOr<uint64_t> handle;
    {
      // Output the engine produces at once waits for the stream's start (Drain takes this lock).
      std::lock_guard drain_lock(drain_mu_);
      keep_alive_ = shared_from_this();
      handle = env_->engine->Submit(std::move(request), stream_);
      if (!handle.ok()) keep_alive_.reset();
      if (handle.ok() && stream_mode_) {
        exchange_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      }
    }
    if (!handle.ok()) return Reject(handle.status());
    bool gone;
    {
      std::lock_guard lock(mu_);
      handle_ = *handle;
      gone = gone_;
    }
    // The client left between the check above and now: ClientGone left the cancelling to us.
    if (gone) env_->engine->Cancel(*handle, absl::CancelledError("the client went away"));
    Drain();
  }

  // On the send executor (or the submitting thread): everything the engine produced so far.
  void Drain() {
    std::shared_ptr<OpenAiCall> finished;  // released after the lock: it may be the last owner
    std::lock_guard drain_lock(drain_mu_);
    StreamChunk chunk;
    while (stream_->Take(&chunk)) {
      if (chunk.done) {
        finished = std::move(keep_alive_);
        client_place_.Reset();  // before the client can hear the end and send again
      }
      if (stream_mode_) {
        exchange_->Write(answer_->StreamEvents(chunk));
        if (chunk.done) exchange_->End();
        continue;
      }
      if (chunk.done && !chunk.status.ok()) {
        exchange_->Respond(OpenAiErrorResponse(OpenAiErrorFrom(chunk.status)));
        continue;
      }
      answer_->Accumulate(chunk);
      if (chunk.done) {
        HttpResponse r;
        r.content_type = "application/json";
        r.body = answer_->Final().dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
        exchange_->Respond(std::move(r));
      }
    }
  }

  // A watcher or polling thread: the connection closed before the answer was complete.
  void ClientGone() {
    uint64_t handle;
    {
      std::lock_guard lock(mu_);
      gone_ = true;
      handle = handle_;
    }
    if (handle != 0) env_->engine->Cancel(handle, absl::CancelledError("the client went away"));
  }

  CallEnv* const env_;
  const std::string* const served_model_;
  const OpenAiEndpoint endpoint_;
  std::string body_;
  std::string session_id_;
  std::string authorization_;  // the header, for the per-client limit
  std::string peer_;
  ClientLimiter::Lease client_place_;  // given back as the answer ends
  const std::shared_ptr<HttpExchange> exchange_;
  std::string request_id_;
  bool stream_mode_ = false;
  std::optional<OpenAiAnswer> answer_;
  std::shared_ptr<RequestStream> stream_;
  std::mutex drain_mu_;  // Drain runs on up to two sender threads
  // The call owns itself from submission until the engine's last chunk is taken: only weak
  // references reach it from the stream's callback and the exchange.
  std::shared_ptr<OpenAiCall> keep_alive_;  // guarded by drain_mu_
  std::mutex mu_;
  uint64_t handle_ = 0;  // 0 until submitted
  bool gone_ = false;
};

HttpResponse Json(int status, const OrderedJson& body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump();
  return r;
}

}  // namespace

OpenAiService::OpenAiService(CallEnv* env, std::string served_model, int64_t max_context_tokens)
    : env_(env),
      served_model_(std::move(served_model)),
      max_context_tokens_(max_context_tokens),
      created_(absl::ToUnixSeconds(absl::Now())) {}

HttpResponse OpenAiService::ErrorResponse(int status, const std::string& message) {
  OpenAiError e;
  e.http_status = status;
  e.type = status == 404 ? "not_found_error" : "invalid_request_error";
  e.message = message;
  return OpenAiErrorResponse(e);
}

OrderedJson OpenAiService::ModelObject() const {
  return {{"id", served_model_},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "specula"},
          {"max_model_len", max_context_tokens_},
          {"specula_version", std::string(GetBuildInfo().version)}};
}

HttpResponse OpenAiService::Health() const {
  if (env_->failing.load()) return Json(503, {{"status", "failing"}});
  if (env_->draining.load()) return Json(503, {{"status", "draining"}});
  if (env_->stalled.load()) return Json(503, {{"status", "stalled"}});
  return Json(200, {{"status", "ok"}});
}

std::optional<HttpResponse> OpenAiService::Authenticate(const HttpRequest& request) const {
  if (Authorized(*env_, request)) return std::nullopt;
  return OpenAiErrorResponse(OpenAiErrorFrom(absl::UnauthenticatedError(kUnauthenticatedMessage)));
}

std::vector<std::string> OpenAiService::OpenPaths() { return {"/health"}; }

std::vector<HttpRoute> OpenAiService::Routes() {
  auto generation = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
      auto call = std::make_shared<OpenAiCall>(env_, &served_model_, endpoint, request,
                                               std::move(exchange));
      call->Start();
    };
  };
  std::vector<HttpRoute> routes;
  HttpRoute chat{"/v1/chat/completions", {"POST"}, nullptr};
  chat.async_handler = generation(OpenAiEndpoint::kChatCompletions);
  HttpRoute completions{"/v1/completions", {"POST"}, nullptr};
  completions.async_handler = generation(OpenAiEndpoint::kCompletions);
  routes.push_back(std::move(chat));
  routes.push_back(std::move(completions));
  // Every route but /health needs a token (Authenticate, run by the listener before routing).
  routes.push_back({"/v1/models", {"GET"}, [this](const HttpRequest&) {
                      return Json(200, {{"object", "list"},
                                        {"data", OrderedJson::array({ModelObject()})}});
                    }});
  routes.push_back({"/v1/models/" + served_model_, {"GET"},
                    [this](const HttpRequest&) { return Json(200, ModelObject()); }});
  routes.push_back({"/health", {"GET", "HEAD"}, [this](const HttpRequest&) { return Health(); }});
  return routes;
}

}  // namespace specula
