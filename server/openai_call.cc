#include "server/openai_call.h"

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "server/openai_request.h"
#include "server/request_convert.h"
#include "server/status.h"

namespace specula {
namespace {

// One HTTP generation: parsed, rendered and tokenized on the tokenizer queue, submitted to the
// engine, and answered through the exchange as the engine produces (SSE) or at the end (JSON).
class OpenAiCall : public std::enable_shared_from_this<OpenAiCall> {
 public:
  OpenAiCall(CallEnv* env, std::unique_ptr<OpenAiProtocol> protocol, const HttpRequest& request,
             std::shared_ptr<HttpExchange> exchange)
      : env_(env),
        protocol_(std::move(protocol)),
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

  // A bug that throws answers 500 rather than ending the process (the worker threads and the
  // listener's connections have no handler of their own).
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
    if (std::optional<OpenAiError> e = protocol_->Parse(body_)) {
      return Reject(*e, e->http_status == 404 ? absl::StatusCode::kNotFound
                                              : absl::StatusCode::kInvalidArgument);
    }
    std::string().swap(body_);
    v1::GenerateRequest& generate = protocol_->generate();
    if (!session_id_.empty()) generate.set_session_id(session_id_);
    std::optional<ChatStream> chat;
    ConstraintSpec tool_constraint;  // strict tools'
    ChatPromptFacts facts;           // from the rendered chat
    if (const ChatRequest* request = protocol_->chat()) {
      if (env_->chat == nullptr || !env_->chat->has_template())
        return Reject(NoChatTemplateError());
      absl::StatusOr<RenderedChat> rendered = env_->chat->Render(*request);
      if (!rendered.ok()) return Reject(rendered.status());
      generate.set_prompt(rendered->prompt_text);
      generate.set_add_special_tokens(false);  // the template wrote them
      chat.emplace(env_->chat->output_format(), *rendered);
      tool_constraint = std::move(rendered->constraint);
      facts.plain_ranges = std::move(rendered->plain_ranges);
      facts.answer_lead = rendered->answer_lead;
    }
    const Tokenizer& tokenizer = env_->engine->generator().tokenizer();
    absl::StatusOr<EngineRequest> converted = ToEngineRequest(
        generate, tokenizer, env_->default_max_tokens, env_->max_total_tokens, facts);
    if (!converted.ok()) return Reject(converted.status());
    // Never set together with a response format's (the parsers refuse that).
    if (!tool_constraint.empty()) converted->generation.constraint = std::move(tool_constraint);
    request_id_ = converted->request_id;
    stream_mode_ = protocol_->stream();
    protocol_->Begin(request_id_, tokenizer, std::move(chat));
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
        exchange_->Write(protocol_->StartEvents());
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
        exchange_->Write(protocol_->StreamEvents(chunk));
        if (chunk.done) exchange_->End();
        continue;
      }
      if (chunk.done && !chunk.status.ok()) {
        exchange_->Respond(OpenAiErrorResponse(OpenAiErrorFrom(chunk.status)));
        continue;
      }
      protocol_->Accumulate(chunk);
      if (chunk.done) {
        exchange_->Respond(JsonResponse(200, protocol_->Final()));
      }
    }
    if (finished != nullptr && env_->metrics != nullptr) {
      env_->metrics->RecordToolCallParseFailures(protocol_->malformed_tool_calls());
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
  const std::unique_ptr<OpenAiProtocol> protocol_;
  std::string body_;
  std::string session_id_;
  std::string authorization_;  // the header, for the per-client limit
  std::string peer_;
  ClientLimiter::Lease client_place_;  // given back as the answer ends
  const std::shared_ptr<HttpExchange> exchange_;
  std::string request_id_;
  bool stream_mode_ = false;
  std::shared_ptr<RequestStream> stream_;
  std::mutex drain_mu_;  // Drain runs on up to two sender threads
  // The call owns itself from submission until the engine's last chunk is taken: only weak
  // references reach it from the stream's callback and the exchange.
  std::shared_ptr<OpenAiCall> keep_alive_;  // guarded by drain_mu_
  std::mutex mu_;
  uint64_t handle_ = 0;  // 0 until submitted
  bool gone_ = false;
};

}  // namespace

void StartOpenAiCall(CallEnv* env, std::unique_ptr<OpenAiProtocol> protocol,
                     const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
  auto call = std::make_shared<OpenAiCall>(env, std::move(protocol), request, std::move(exchange));
  call->Start();
}

}  // namespace specula
