// The specula daemon in one object: loads the model, runs the serving engine, the gRPC server
// (specula.v1.Specula, grpc.health.v1.Health, reflection) and the /metrics endpoint.
// Start() returns once everything listens; Shutdown() drains and stops. main() adds only flags,
// signals and the embedded-default model; tests start a Server in-process on port 0.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/serve/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/bearer_tokens.h"
#include "server/chat.h"
#include "server/config.h"
#include "server/watchdog.h"
#include "server/generate_call.h"
#include "server/grpc_acceptor.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/request_log.h"
#include "server/specula_service.h"

namespace specula {

class Server {
 public:
  // `config.model.path` must name a model directory (main resolves the embedded default).
  // Errors name the config key at fault (model.path, model.device, server.listen, ...).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config);
  ~Server();  // Shutdown(no grace) if still running

  // The addresses actually bound ("127.0.0.1:41235" when the config said port 0). The metrics
  // address is empty when server.metrics_listen is empty.
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // The OpenAI-compatible HTTP API's address; empty when server.http_listen is empty.
  const std::string& http_address() const { return http_address_; }
  // The model id of the OpenAI API (model.name, or the model directory's name).
  const std::string& served_model_name() const { return served_model_name_; }

  Engine& engine() { return *engine_; }
  ServerMetrics& metrics() { return *metrics_; }
  // Where long prompts are tokenized (tests pause it to hold calls there).
  WorkQueue& tokenizer_queue() { return *tokenizer_queue_; }
  // Text prompts longer than this go to the tokenizer queue (default kInlineTokenizeBytes); call
  // before the first request.
  void SetInlineTokenizeBytesForTesting(size_t bytes) { env_.inline_tokenize_bytes = bytes; }
  // Generate calls gRPC reported gone (cancelled, deadline) before they reached the engine.
  int64_t calls_gone_before_submit() const { return env_.gone_before_submit.load(); }
  // Null when server.stall_seconds is 0.
  const Watchdog* watchdog() const { return watchdog_.get(); }

  // Health goes NOT_SERVING and new calls get UNAVAILABLE at once; in-flight requests get up to
  // `grace` to finish, then end with UNAVAILABLE; then the gRPC server stops. Idempotent;
  // returns the number of requests that were cut off.
  int Shutdown(absl::Duration grace);
  // Reads server.auth.token_file again (SIGHUP); on an error the tokens in use stay. Any thread.
  absl::Status ReloadAuthTokens();

  // The fatal-condition path, for what the server cannot recover from (gRPC's TLS listener
  // died, ...). Any thread, never calls into gRPC: logs `event=fatal`, counts
  // specula_fatal_errors_total{cause}, turns HTTP /health to 503 "failing", and runs the fatal
  // handler once. The handler's owner (main) then calls Shutdown with a short grace, which turns
  // gRPC health NOT_SERVING and ends in-flight requests with UNAVAILABLE naming the cause, and
  // exits with status 1 so the orchestrator restarts the process. Later reports only log.
  void ReportFatal(const std::string& cause, const std::string& error);
  // Runs on the reporting thread after the first ReportFatal (at once if one came already).
  void SetFatalHandler(std::function<void()> handler);

 private:
  // The environment every call shares (engine, limits, queues); after the engine exists.
  void InitCallEnv(const ServerConfig& config, const v1::ModelInfo& model_info);
  // The Prometheus exposer (server.metrics_listen), if configured; errors name the key.
  absl::Status StartMetrics(const ServerConfig& config);
  // Builds and starts the gRPC server with service_; UNAVAILABLE naming server.listen.
  absl::Status StartGrpc(const ServerConfig& config);
  // server.stall_seconds: health follows whether the engine makes progress.
  void StartWatchdog(const ServerConfig& config);
  // The server_listening line: addresses, model, chat template, auth and TLS.
  void LogListening() const;
  // The OpenAI-compatible listener (server.http_listen), if configured.
  absl::Status StartHttp(const ServerConfig& config, const v1::ModelInfo& model_info);

  Server() = default;

  ServerConfig config_;
  std::string address_;
  std::string metrics_address_;
  std::string http_address_;
  std::string served_model_name_;
  std::unique_ptr<ChatModel> chat_;
  std::unique_ptr<BearerTokens> auth_;  // null: no authentication
  std::unique_ptr<ClientLimiter> client_limiter_;  // null: no per-client limit
  std::unique_ptr<ServerMetrics> metrics_;
  RequestLog request_log_;
  std::unique_ptr<EngineObserver> device_fault_watch_;  // takes the fatal path on a device fault
  std::unique_ptr<ObserverList> observers_;
  std::unique_ptr<SendExecutor> sender_;  // outlives the engine, which posts to it
  std::unique_ptr<Engine> engine_;
  // Tokenizes long prompts off gRPC's threads; outlives the gRPC server, whose shutdown waits for
  // the calls its tasks finish.
  std::unique_ptr<WorkQueue> tokenizer_queue_;
  CallEnv env_;
  std::unique_ptr<SpeculaService> service_;
  std::unique_ptr<ResponseStore> responses_;  // the Responses API's; outlives openai_
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<grpc::Server> grpc_server_;  // destroyed after the HTTP listener
  std::unique_ptr<GrpcAcceptor> grpc_acceptor_;  // plaintext only; stopped before grpc_server_
  std::unique_ptr<HttpServer> http_server_;    // destroyed first: its requests use the above
  std::unique_ptr<Watchdog> watchdog_;         // stopped first by Shutdown: it sets health
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
  std::mutex fatal_mu_;
  std::string fatal_cause_;  // the first ReportFatal's; guarded by fatal_mu_
  std::function<void()> fatal_handler_;  // guarded by fatal_mu_
};

}  // namespace specula
