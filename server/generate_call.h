// One Generate stream: a gRPC callback reactor fed by the request's RequestStream.
//
// Reactions never block: the engine thread's ready-notification (handed to the SendExecutor, so
// the engine thread does no socket work) and OnWriteDone both call TrySend, which takes everything pending (coalesced into one message) and starts one write; a
// write in flight makes later notifications no-ops until it completes. The call finishes only
// when the engine closes the stream, so KV is always freed before the client hears the end.
//
// Lifetime: owned by a shared_ptr to itself until gRPC calls OnDone; the engine-side callback
// holds a weak_ptr, so a notification racing with OnDone never touches a destroyed reactor.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "engine/serve/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/bearer_tokens.h"
#include "server/chat.h"
#include "server/client_limiter.h"
#include "server/metrics.h"
#include "server/request_convert.h"
#include "server/send_executor.h"
#include "server/work_queue.h"
#include "specula/v1/specula.pb.h"

namespace specula {

// Text prompts longer than this are tokenized on CallEnv::tokenizer_queue, not on the gRPC thread
// that received them (shorter ones take well under a millisecond).
inline constexpr size_t kInlineTokenizeBytes = 16 * 1024;

// What every call needs from the server; outlives all calls.
struct CallEnv {
  Engine* engine = nullptr;
  const BearerTokens* auth = nullptr;  // null: no authentication (server.auth.token_file unset)
  ClientLimiter* client_limiter = nullptr;  // server.limits.max_requests_per_client; may be null
  ServerMetrics* metrics = nullptr;  // may be null
  SendExecutor* sender = nullptr;    // runs sends the engine thread asks for
  WorkQueue* tokenizer_queue = nullptr;  // tokenizes long prompts; null = on the calling thread
  size_t max_tokenizing = 16;            // scheduler.max_tokenizing_requests
  size_t inline_tokenize_bytes = kInlineTokenizeBytes;  // tests lower it
  int32_t default_max_tokens = 0;  // scheduler.default_max_tokens: 0 = the remaining context
  TotalTokenLimits max_total_tokens;  // prompt + output, for the default output length
  int64_t max_request_bytes = 4 << 20;
  const ChatModel* chat = nullptr;  // renders messages; null = chat requests are refused
  std::atomic<bool> draining{false};
  std::atomic<bool> stalled{false};  // the watchdog saw no progress (server.stall_seconds)
  std::atomic<bool> failing{false};  // the server took its fatal path (Server::ReportFatal)
  // Calls whose client left (or whose deadline passed) before they reached the engine, as gRPC
  // reported it (OnCancel); tests wait on it.
  std::atomic<int64_t> gone_before_submit{0};
};

// UNAUTHENTICATED unless the call's `authorization` metadata holds a bearer token of env.auth
// (when authentication is on). The health service does not ask.
absl::Status CheckAuth(const CallEnv& env, const grpc::CallbackServerContext& ctx);

// Checks every call makes first: UNAVAILABLE while draining, INVALID_ARGUMENT when the request is
// above server.max_receive_message_bytes (gRPC's own limit is set higher so that such requests
// reach us and get a message naming the key).
absl::Status CheckAdmission(const CallEnv& env, const google::protobuf::Message& request);

// A place for one more generation of the client behind `authorization` (when authentication is
// on) or `peer`; RESOURCE_EXHAUSTED past server.limits.max_requests_per_client.
absl::StatusOr<ClientLimiter::Lease> AcquireClientPlace(const CallEnv& env,
                                                        const std::string* authorization,
                                                        absl::string_view peer);

// Runs `task` on env.tokenizer_queue: false (and RESOURCE_EXHAUSTED in `refusal`) when
// scheduler.max_tokenizing_requests tasks are already queued or running.
bool PostTokenization(const CallEnv& env, std::function<void()> task, absl::Status* refusal);

// Whether the client gave up on the call: cancelled it, or its deadline passed (checked directly,
// since gRPC may not have noticed yet). Any thread.
bool ClientGone(const grpc::CallbackServerContext& ctx);

// How a call the client gave up on ends: DEADLINE_EXCEEDED when its deadline passed, else
// CANCELLED.
absl::Status ClientGoneStatus(const grpc::CallbackServerContext& ctx);

// The method is registered raw (server/request_parse.h): the reactor parses the request bytes
// itself and writes serialized responses.
class GenerateCall : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                     public std::enable_shared_from_this<GenerateCall> {
 public:
  // Creates the reactor and parses, validates and submits the request (a long text prompt is
  // tokenized on env->tokenizer_queue first); returns it for gRPC to drive.
  static grpc::ServerWriteReactor<grpc::ByteBuffer>* Start(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* request,
                                                           CallEnv* env);

  GenerateCall(grpc::CallbackServerContext* ctx, CallEnv* env) : ctx_(ctx), env_(env) {}

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void Begin(const grpc::ByteBuffer& bytes);
  // Tokenizes and submits request_ to the engine.
  void Submit();
  // OnCancel ran, or the deadline passed, before the request reached the engine.
  bool ClientGone();
  void Reject(const absl::Status& status);
  void TrySend();
  // The call's answer is decided (holding mu_): nothing more is sent, and the client's place
  // goes back.
  void MarkFinishedLocked();

  grpc::CallbackServerContext* const ctx_;
  CallEnv* const env_;
  std::shared_ptr<GenerateCall> self_;  // released in OnDone
  v1::GenerateRequest request_;
  std::shared_ptr<RequestStream> stream_;
  std::string request_id_;
  std::optional<ChatStream> chat_;  // a request with messages: its answer's parser
  ClientLimiter::Lease client_place_;  // given back as the call finishes

  std::mutex mu_;
  uint64_t handle_ = 0;     // 0 until submitted
  bool cancelled_ = false;  // OnCancel ran before the request was submitted
  bool writing_ = false;
  bool finished_ = false;
  bool broken_ = false;  // a write failed: the client is gone
  v1::GenerateResponse response_;
  grpc::ByteBuffer response_bytes_;
};

}  // namespace specula
