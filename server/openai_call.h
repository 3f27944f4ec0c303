// One generation over the OpenAI-compatible HTTP API: admitted, parsed, rendered and tokenized
// (on the tokenizer queue for large bodies), submitted to the engine, and answered through the
// exchange as the engine produces (SSE) or at the end (JSON). The endpoints differ only in their
// OpenAiProtocol: how a body becomes a request and how the output is written back.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/serve/request_stream.h"
#include "server/chat.h"
#include "server/generate_call.h"
#include "server/http_server.h"
#include "server/openai_params.h"
#include "specula/v1/specula.pb.h"

namespace specula {

// What one endpoint does with a request. Called by one call at a time, in order: Parse, then
// (if it succeeded) Begin, then StartEvents (streaming), then StreamEvents or Accumulate for
// each chunk, then Final (non-streaming, when the request ended well).
class OpenAiProtocol {
 public:
  virtual ~OpenAiProtocol() = default;

  // Parses and checks the body. Fills generate() (everything but the prompt of a chat request,
  // which the call renders from chat()).
  virtual std::optional<OpenAiError> Parse(const std::string& body) = 0;
  virtual v1::GenerateRequest& generate() = 0;
  // The conversation to render; null for a plain prompt (completions).
  virtual const ChatRequest* chat() const = 0;
  virtual bool stream() const = 0;

  // The request was accepted as `request_id`; `chat` parses a chat answer.
  virtual void Begin(const std::string& request_id, const Tokenizer& tokenizer,
                     std::optional<ChatStream> chat) = 0;
  virtual std::string StartEvents() { return ""; }
  virtual std::string StreamEvents(const StreamChunk& chunk) = 0;
  virtual void Accumulate(const StreamChunk& chunk) = 0;
  virtual OrderedJson Final() = 0;
  // After the last chunk: tool calls the model began that did not parse.
  virtual int malformed_tool_calls() const = 0;
};

// Starts a call: it owns itself until the answer is complete.
void StartOpenAiCall(CallEnv* env, std::unique_ptr<OpenAiProtocol> protocol,
                     const HttpRequest& request, std::shared_ptr<HttpExchange> exchange);

}  // namespace specula
