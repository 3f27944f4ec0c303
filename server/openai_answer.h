// The engine's output of one OpenAI API request written back as OpenAI's JSON objects: the
// response of a non-streaming request, or the SSE chunks of a streaming one. docs/CHAT.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/serve/request_stream.h"
#include "server/chat.h"
#include "server/openai_request.h"

namespace specula {

// The answer of one request as OpenAI objects. Not thread-safe: one consumer.
class OpenAiAnswer {
 public:
  // `decode` gives a token's text (for logprobs). `chat` is set for chat completions.
  OpenAiAnswer(const OpenAiRequest& request, std::string request_id,
               std::function<std::string(int32_t)> decode, std::optional<ChatStream> chat);

  // Streaming: the SSE events (each "data: {...}\n\n") for a chunk of the engine's output; the
  // last chunk adds the finish chunk, the usage chunk (include_usage) and "data: [DONE]". A
  // failed end becomes an error event before [DONE].
  std::string StreamEvents(const StreamChunk& chunk);
  // Non-streaming: adds a chunk; Final() then gives the whole response.
  void Accumulate(const StreamChunk& chunk);
  OrderedJson Final();
  // Tool calls the model began that did not parse (chat completions with tools).
  int malformed_tool_calls() const { return chat_ ? chat_->malformed_tool_calls() : 0; }

 private:
  static std::string Event(const OrderedJson& object);
  OrderedJson ChunkObject(OrderedJson choice) const;
  OrderedJson StreamChoice(ChatDelta delta, const StreamChunk& chunk);
  OrderedJson ToolCallsJson(const std::vector<ChatToolCall>& calls, bool indexed);
  OrderedJson LogprobsOf(const std::vector<SampledToken>& tokens) const;
  OrderedJson CompletionLogprobs(const std::vector<SampledToken>& tokens);
  std::string FinishReason(const StreamChunk& chunk) const;
  OrderedJson Usage(const StreamChunk& chunk) const;
  // Splits a chunk's text by the chat parser (content only for completions).
  ChatDelta Parse(const StreamChunk& chunk);

  const OpenAiEndpoint endpoint_;
  const std::string model_;
  const std::string id_;
  const int64_t created_;
  const bool include_usage_;
  const bool logprobs_;
  const std::function<std::string(int32_t)> decode_;
  std::optional<ChatStream> chat_;
  bool sent_role_ = false;
  int tool_calls_sent_ = 0;
  // Non-streaming totals.
  std::string content_, reasoning_;
  std::vector<ChatToolCall> tool_calls_;
  std::vector<SampledToken> logprob_tokens_;
  int64_t text_offset_ = 0;  // completions' logprobs.text_offset
  std::string finish_reason_;
  OrderedJson usage_;
};

}  // namespace specula
