// OpenAI's HTTP API requests (chat completions, completions) on specula's request path: bodies
// parsed into the same v1::GenerateRequest a gRPC client sends (so both share one set of checks
// and limits), and refusals in OpenAI's error format. The answers are server/openai_answer.h, the
// listener server/openai_service.h. docs/CHAT.md lists every field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/chat.h"
#include "server/http_server.h"
#include "specula/v1/specula.pb.h"

namespace specula {

// An error in OpenAI's format: {"error": {"message", "type", "param", "code"}} with its status.
struct OpenAiError {
  int http_status = 400;
  std::string type;  // invalid_request_error, not_found_error, ...
  std::string message;
  std::string param;  // the offending field, or ""
  std::string code;   // e.g. "model_not_found", or ""
};

OpenAiError OpenAiErrorFrom(const absl::Status& status, std::string param = "");
HttpResponse OpenAiErrorResponse(const OpenAiError& error);
std::string OpenAiErrorJson(const OpenAiError& error);

enum class OpenAiEndpoint { kChatCompletions, kCompletions };

// A request body, parsed and checked.
struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChatCompletions;
  std::string model;
  // Everything but the prompt (chat: rendered later, on the tokenizer queue) in the gRPC form.
  v1::GenerateRequest generate;
  std::optional<ChatRequest> chat;  // chat completions
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // chat: logprobs; completions: logprobs set
  int top_logprobs = 0;
};

// Parses a body for `endpoint`. `served_model` is the one model id accepted (404 otherwise).
// Unsupported parameters (n > 1, response_format json, logit_bias, ...) are 400 naming them:
// never silently ignored.
// A request without max_tokens leaves stopping.max_tokens unset: ToEngineRequest applies the
// server's one rule for it. nullopt when valid.
std::optional<OpenAiError> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body,
                                              const std::string& served_model,
                                              OpenAiRequest* out);

}  // namespace specula
