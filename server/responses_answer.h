// The engine's output of one Responses API request as OpenAI's objects: output items (reasoning,
// message, function_call), the streaming events (response.created ... response.completed), the
// response object, and the turn a stored response keeps. docs/CHAT.md, "Responses API".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/serve/request_stream.h"
#include "server/chat.h"
#include "server/responses_request.h"

namespace specula {

// Not thread-safe: one consumer.
class ResponsesAnswer {
 public:
  ResponsesAnswer(const ResponsesRequest& request, std::string response_id, ChatStream chat);

  // Streaming: response.created and response.in_progress, before any output.
  std::string StartEvents();
  // Streaming: the SSE events ("event: TYPE\ndata: {...}\n\n") for a chunk; the last chunk
  // closes the open item and ends with response.completed, .incomplete (max_output_tokens) or
  // .failed.
  std::string StreamEvents(const StreamChunk& chunk);
  // Non-streaming: adds a chunk (the items, without writing events).
  void Accumulate(const StreamChunk& chunk) { StreamEvents(chunk); }

  // After the last chunk: the response object (what POST returns and GET repeats).
  OrderedJson Response() const;
  // After the last chunk: whether it ended without an error, and this turn's output as one
  // canonical assistant message (server/responses_request.h).
  bool succeeded() const { return ended_ && error_.is_null(); }
  OrderedJson OutputMessage() const;

  const std::string& id() const { return id_; }
  int malformed_tool_calls() const { return chat_.malformed_tool_calls(); }

 private:
  enum class Open { kNone, kReasoning, kMessage };

  std::string Event(const char* type, OrderedJson fields);
  std::string Delta(const ChatDelta& delta);
  std::string OpenItem(Open kind);
  std::string CloseItem(const char* status);
  std::string FunctionCall(const ChatToolCall& call);
  std::string End(const StreamChunk& chunk);
  OrderedJson ResponseObject(const char* status) const;

  const OrderedJson echo_;
  const std::string model_;
  const bool streaming_;  // events are written (else only the items and the response are kept)
  const std::string id_;
  const int64_t created_at_;
  ChatStream chat_;
  int64_t sequence_ = 0;
  Open open_ = Open::kNone;
  std::string open_id_;
  std::string open_text_;                      // the open item's text so far
  OrderedJson output_ = OrderedJson::array();  // finished items
  // The turn's output, for OutputMessage.
  std::string content_, reasoning_;
  OrderedJson tool_calls_ = OrderedJson::array();
  int64_t reasoning_tokens_ = 0;
  bool ended_ = false;
  std::string status_ = "in_progress";
  OrderedJson incomplete_details_;
  OrderedJson error_;
  OrderedJson usage_;
};

}  // namespace specula
