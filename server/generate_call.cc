#include "server/generate_call.h"

#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/common/log.h"
#include "server/chat_proto.h"
#include "server/request_convert.h"
#include "server/request_parse.h"
#include "server/status.h"

namespace specula {
namespace {

// The value of the client's `key` metadata, if it sent one.
std::optional<std::string> MetadataValue(const grpc::CallbackServerContext& ctx,
                                         absl::string_view key) {
  const auto found = ctx.client_metadata().find(grpc::string_ref(key.data(), key.size()));
  if (found == ctx.client_metadata().end()) return std::nullopt;
  return std::string(found->second.data(), found->second.size());
}

// A proxy that routes an agent's turns to the replica holding its KV hashes on metadata, never
// on the body: a client behind one sends its session id as x-session-id metadata (and may leave
// session_id unset). Both set and different is a client error, not a silent choice.
absl::Status ApplySessionMetadata(const grpc::CallbackServerContext& ctx,
                                  v1::GenerateRequest* request) {
  const std::optional<std::string> id = MetadataValue(ctx, kSessionIdMetadata);
  if (!id.has_value()) return absl::OkStatus();
  if (request->session_id().empty()) {
    request->set_session_id(*id);
    return absl::OkStatus();
  }
  if (request->session_id() != *id) {
    return absl::InvalidArgumentError(
        absl::StrFormat("session_id '%s' differs from the %s metadata '%s'", request->session_id(),
                        kSessionIdMetadata, *id));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAuth(const CallEnv& env, const grpc::CallbackServerContext& ctx) {
  if (env.auth == nullptr) return absl::OkStatus();
  const std::optional<std::string> authorization = MetadataValue(ctx, "authorization");
  if (authorization.has_value() && env.auth->Allows(*authorization)) return absl::OkStatus();
  return absl::UnauthenticatedError(kUnauthenticatedMessage);
}

absl::Status CheckAdmission(const CallEnv& env, const google::protobuf::Message& request) {
  if (env.draining.load()) {
    return absl::UnavailableError("the server is shutting down; retry on another replica");
  }
  const size_t bytes = request.ByteSizeLong();
  if (bytes > static_cast<size_t>(env.max_request_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the request is %d bytes; server.max_receive_message_bytes is %d", bytes,
                        env.max_request_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientLimiter::Lease> AcquireClientPlace(const CallEnv& env,
                                                        const std::string* authorization,
                                                        absl::string_view peer) {
  if (env.client_limiter == nullptr) return ClientLimiter::Lease();
  return env.client_limiter->Acquire(
      ClientIdentity(env.auth != nullptr ? authorization : nullptr, peer));
}

bool PostTokenization(const CallEnv& env, std::function<void()> task, absl::Status* refusal) {
  if (env.tokenizer_queue->TryPost(std::move(task), env.max_tokenizing)) return true;
  if (env.tokenizer_queue->closed()) {  // the drain began after this call's admission check
    *refusal = absl::UnavailableError("the server is shutting down; retry on another replica");
    return false;
  }
  *refusal = absl::ResourceExhaustedError(
      absl::StrFormat("%d long prompts are already waiting to be tokenized "
                      "(scheduler.max_tokenizing_requests); retry later",
                      env.max_tokenizing));
  return false;
}

bool ClientGone(const grpc::CallbackServerContext& ctx) {
  return ctx.IsCancelled() || ctx.deadline() <= std::chrono::system_clock::now();
}

absl::Status ClientGoneStatus(const grpc::CallbackServerContext& ctx) {
  return ctx.deadline() <= std::chrono::system_clock::now()
             ? absl::DeadlineExceededError("deadline exceeded")
             : absl::CancelledError("cancelled by the client");
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateCall::Start(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* request,
                                                                CallEnv* env) {
  auto call = std::make_shared<GenerateCall>(ctx, env);
  call->self_ = call;
  call->Begin(*request);
  return call.get();
}

void GenerateCall::MarkFinishedLocked() {
  finished_ = true;
  client_place_.Reset();  // before the client can hear the end and send again
}

void GenerateCall::Reject(const absl::Status& status) {
  if (env_->metrics) env_->metrics->RecordRejected(status.code());
  Log(LogLevel::kInfo, "request_rejected",
      {{"request_id", request_id_},
       {"status", StatusCodeName(status.code())},
       {"error", status.message()}});
  {
    std::lock_guard lock(mu_);
    MarkFinishedLocked();
  }
  Finish(ToGrpcStatus(status));
}

void GenerateCall::Begin(const grpc::ByteBuffer& bytes) {
  if (absl::Status s = CheckAuth(*env_, *ctx_); !s.ok()) return Reject(s);
  if (absl::Status s = ParseRequest(bytes, &request_); !s.ok()) return Reject(s);
  if (absl::Status s = ApplySessionMetadata(*ctx_, &request_); !s.ok()) return Reject(s);
  // Logged with rejections before its length is checked: never more than the allowed length.
  request_id_ = request_.request_id().substr(0, kMaxRequestIdBytes);
  if (absl::Status s = CheckAdmission(*env_, request_); !s.ok()) return Reject(s);
  {
    const std::optional<std::string> authorization = MetadataValue(*ctx_, "authorization");
    absl::StatusOr<ClientLimiter::Lease> place = AcquireClientPlace(
        *env_, authorization.has_value() ? &*authorization : nullptr, ctx_->peer());
    if (!place.ok()) return Reject(place.status());
    client_place_ = *std::move(place);
  }
  const size_t text_bytes =
      request_.messages().empty() ? request_.prompt().size() : request_.ByteSizeLong();
  if (env_->tokenizer_queue != nullptr && text_bytes > env_->inline_tokenize_bytes) {
    absl::Status refusal;
    if (!PostTokenization(
            *env_, [self = shared_from_this()] { self->Submit(); }, &refusal)) {
      return Reject(refusal);
    }
    return;
  }
  Submit();
}

bool GenerateCall::ClientGone() {
  if (specula::ClientGone(*ctx_)) return true;
  std::lock_guard lock(mu_);
  return cancelled_;
}

void GenerateCall::Submit() {
  // A client that left while its prompt waited for the tokenizer costs no tokenizing.
  if (ClientGone()) return Reject(ClientGoneStatus(*ctx_));
  absl::StatusOr<std::optional<RenderedChat>> chat = ApplyChatTemplate(env_->chat, &request_);
  if (!chat.ok()) return Reject(chat.status());
  if (chat->has_value()) chat_.emplace(env_->chat->output_format(), **chat);
  absl::StatusOr<EngineRequest> converted = ToEngineRequest(
      request_, env_->engine->generator().tokenizer(), env_->default_max_tokens,
      env_->max_total_tokens,
      chat->has_value() ? ChatPromptFacts{(**chat).plain_ranges, (**chat).answer_lead}
                        : ChatPromptFacts());
  // The engine request holds what is needed; free the prompt text (Clear would keep its memory).
  // gRPC still holds the request bytes until the call ends.
  v1::GenerateRequest().Swap(&request_);
  if (!converted.ok()) return Reject(converted.status());
  // Strict tools' constraint (a response format's is compiled by ToEngineRequest; the two are
  // never both set: ApplyChatTemplate refuses that).
  if (chat->has_value() && !(**chat).constraint.empty()) {
    converted->generation.constraint = std::move((**chat).constraint);
  }
  request_id_ = converted->request_id;
  if (ctx_->deadline() != std::chrono::system_clock::time_point::max()) {
    converted->deadline = absl::FromChrono(ctx_->deadline());
  }
  // A client that left while its prompt was tokenized: nothing to submit.
  if (ClientGone()) return Reject(ClientGoneStatus(*ctx_));
  std::weak_ptr<GenerateCall> weak = weak_from_this();
  SendExecutor* sender = env_->sender;
  stream_ = std::make_shared<RequestStream>([weak, sender] {
    sender->Post([weak] {
      if (auto call = weak.lock()) call->TrySend();
    });
  });
  absl::StatusOr<uint64_t> handle = env_->engine->Submit(*std::move(converted), stream_);
  if (!handle.ok()) return Reject(handle.status());
  bool cancelled;
  {
    std::lock_guard lock(mu_);
    handle_ = *handle;
    cancelled = cancelled_;
  }
  // OnCancel ran between the check above and now: it left the cancelling to us.
  if (cancelled) env_->engine->Cancel(*handle, ClientGoneStatus(*ctx_));
  TrySend();
}

void GenerateCall::TrySend() {
  std::unique_lock lock(mu_);
  if (writing_ || finished_) return;
  StreamChunk chunk;
  // A broken stream still waits for the engine's end, so the call finishes after the KV is freed.
  while (stream_->Take(&chunk)) {
    if (!chunk.done && broken_) continue;
    if (chunk.done && (!chunk.status.ok() || broken_)) {
      MarkFinishedLocked();
      lock.unlock();
      Finish(ToGrpcStatus(chunk.status.ok() ? absl::CancelledError("the client went away")
                                            : chunk.status));
      return;
    }
    response_.Clear();
    FillResponse(chunk, request_id_, &response_);
    if (chat_.has_value()) {
      FillChatDelta(chat_->Push(chunk.text, chunk.done), &response_);
      if (chunk.done && chat_->EndedInToolCalls(chunk.finish)) {
        response_.set_finish_reason(v1::TOOL_CALLS);
      }
      if (chunk.done && env_->metrics != nullptr) {
        env_->metrics->RecordToolCallParseFailures(chat_->malformed_tool_calls());
      }
    }
    if (absl::Status s = SerializeResponse(response_, &response_bytes_); !s.ok()) {
      MarkFinishedLocked();
      const uint64_t handle = handle_;
      lock.unlock();
      env_->engine->Cancel(handle, s);
      Finish(ToGrpcStatus(s));
      return;
    }
    if (chunk.done) {
      MarkFinishedLocked();
      lock.unlock();
      StartWriteAndFinish(&response_bytes_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      writing_ = true;
      lock.unlock();
      StartWrite(&response_bytes_);
    }
    return;
  }
}

void GenerateCall::OnWriteDone(bool ok) {
  uint64_t handle;
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) broken_ = true;
    handle = handle_;
  }
  if (!ok) env_->engine->Cancel(handle, absl::CancelledError("the client stopped reading"));
  TrySend();
}

void GenerateCall::OnCancel() {
  uint64_t handle;
  {
    std::lock_guard lock(mu_);
    handle = handle_;
    // Not submitted yet (the prompt is being tokenized): Submit sees this and stops.
    if (handle == 0) cancelled_ = true;
  }
  if (handle == 0) {
    env_->gone_before_submit.fetch_add(1);
    return;
  }
  env_->engine->Cancel(handle, ClientGoneStatus(*ctx_));
}

void GenerateCall::OnDone() {
  // May destroy this object: nothing after it.
  self_.reset();
}

}  // namespace specula
