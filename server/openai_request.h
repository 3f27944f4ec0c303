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
#include "server/openai_params.h"
#include "specula/v1/specula.pb.h"

namespace specula {

OpenAiError OpenAiErrorFrom(const absl::Status& status, std::string param = "");
HttpResponse OpenAiErrorResponse(const OpenAiError& error);
std::string OpenAiErrorJson(const OpenAiError& error);
// A JSON answer (invalid UTF-8 in generated text written as U+FFFD).
HttpResponse JsonResponse(int status, const OrderedJson& body);

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
