#include "server/generate_call.h"

#include "absl/strings/str_format.h"
#include "engine/common/log.h"
#include "server/request_convert.h"
#include "server/status.h"

namespace specula {

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

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerateCall::Start(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request, CallEnv* env) {
  auto call = std::make_shared<GenerateCall>(ctx, env);
  call->self_ = call;
  call->Begin(*request);
  return call.get();
}

void GenerateCall::Reject(const absl::Status& status) {
  if (env_->metrics) env_->metrics->RecordRejected(status.code());
  Log(LogLevel::kInfo, "request_rejected",
      {{"request_id", request_id_}, {"status", StatusCodeName(status.code())},
       {"error", status.message()}});
  {
    std::lock_guard lock(mu_);
    finished_ = true;
  }
  Finish(ToGrpcStatus(status));
}

void GenerateCall::Begin(const v1::GenerateRequest& request) {
  // Logged with rejections before its length is checked: never more than the allowed length.
  request_id_ = request.request_id().substr(0, kMaxRequestIdBytes);
  if (absl::Status s = CheckAdmission(*env_, request); !s.ok()) return Reject(s);
  absl::StatusOr<EngineRequest> converted =
      ToEngineRequest(request, env_->engine->generator().tokenizer(), env_->default_max_tokens,
                      env_->max_total_tokens);
  if (!converted.ok()) return Reject(converted.status());
  request_id_ = converted->request_id;
  if (ctx_->deadline() != std::chrono::system_clock::time_point::max()) {
    converted->deadline = absl::FromChrono(ctx_->deadline());
  }
  std::weak_ptr<GenerateCall> weak = weak_from_this();
  SendExecutor* sender = env_->sender;
  stream_ = std::make_shared<RequestStream>([weak, sender] {
    sender->Post([weak] {
      if (auto call = weak.lock()) call->TrySend();
    });
  });
  absl::StatusOr<uint64_t> handle = env_->engine->Submit(*std::move(converted), stream_);
  if (!handle.ok()) return Reject(handle.status());
  handle_ = *handle;
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
      finished_ = true;
      lock.unlock();
      Finish(ToGrpcStatus(chunk.status.ok() ? absl::CancelledError("the client went away")
                                            : chunk.status));
      return;
    }
    response_.Clear();
    FillResponse(chunk, request_id_, &response_);
    if (chunk.done) {
      finished_ = true;
      lock.unlock();
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      writing_ = true;
      lock.unlock();
      StartWrite(&response_);
    }
    return;
  }
}

void GenerateCall::OnWriteDone(bool ok) {
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (!ok) broken_ = true;
  }
  if (!ok) env_->engine->Cancel(handle_, absl::CancelledError("the client stopped reading"));
  TrySend();
}

void GenerateCall::OnCancel() {
  if (handle_ == 0) return;
  const bool expired = ctx_->deadline() <= std::chrono::system_clock::now();
  env_->engine->Cancel(handle_, expired ? absl::DeadlineExceededError("deadline exceeded")
                                        : absl::CancelledError("cancelled by the client"));
}

void GenerateCall::OnDone() {
  // May destroy this object: nothing after it.
  self_.reset();
}

}  // namespace specula
