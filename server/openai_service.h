// The OpenAI-compatible HTTP API on its own listener (server.http_listen; docs/CHAT.md):
// POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET and DELETE
// /v1/responses/{id}, GET /v1/models, GET /v1/models/{id}, GET /health. Requests take the gRPC path's steps (the same CallEnv: tokenizer queue, limits,
// engine, metrics), so an HTTP request and a gRPC one are admitted, limited and counted alike.
// A client that closes its connection cancels its request.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/generate_call.h"
#include "server/http_server.h"
#include "server/openai_answer.h"
#include "server/response_store.h"

namespace specula {

class OpenAiService {
 public:
  // `env` outlives the service and every request it started. `served_model` is the one model id
  // requests must name. `responses` (outliving the service and its requests) keeps the Responses
  // API's responses; null leaves that API out.
  OpenAiService(CallEnv* env, std::string served_model, int64_t max_context_tokens,
                ResponseStore* responses);

  std::vector<HttpRoute> Routes();
  // The listener's check before routing (HttpServerOptions::authenticate): 401 in OpenAI's
  // format without a valid bearer token when server.auth is on; OpenPaths() need none (the
  // health probe).
  std::optional<HttpResponse> Authenticate(const HttpRequest& request) const;
  static std::vector<std::string> OpenPaths();

  // The error format of the listener's own refusals (404, 405, 413).
  static HttpResponse ErrorResponse(int status, const std::string& message);

 private:
  OrderedJson ModelObject() const;
  HttpResponse Health() const;

  CallEnv* const env_;
  const std::string served_model_;
  const int64_t max_context_tokens_;
  ResponseStore* const responses_;
  const int64_t created_;
};

}  // namespace specula
