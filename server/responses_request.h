// OpenAI's Responses API requests (POST /v1/responses; docs/CHAT.md, "Responses API"): a body
// parsed into the chat request and generation parameters the chat completions path uses, and
// the conversation rebuilt from the items of the stored responses it continues.
//
// Items become chat messages in one canonical form, which is also what a stored response keeps
// of its turn: {role: user|system|assistant, content}, a function_call as an assistant message
// {content: "", tool_calls: [one call, arguments as an object]}, a function_call_output as
// {role: tool, tool_call_id, content}, a reasoning item as an assistant message with only
// reasoning_content. MergeConversation joins the assistant pieces of one turn into the one
// message the chat templates expect.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/chat.h"
#include "server/openai_params.h"
#include "specula/v1/specula.pb.h"

namespace specula {

struct ResponsesRequest {
  std::string model;
  // Sampling, max_output_tokens and text.format's constraint, in the gRPC form.
  v1::GenerateRequest generate;
  // Tools (in the chat form), tool_choice, parallel_tool_calls and reasoning.effort; the
  // messages are filled in by MergeConversation once the previous responses are found.
  ChatRequest chat;
  // This turn's input as canonical messages (stored with the response).
  OrderedJson input_messages = OrderedJson::array();
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool stream = false;
  // The request's parameters as the response object repeats them: tools (in the Responses
  // form), tool_choice, temperature, top_p, max_output_tokens, parallel_tool_calls, reasoning,
  // text, truncation, metadata, user, store, instructions, previous_response_id.
  OrderedJson echo = OrderedJson::object();
};

// Parses a body. `served_model` is the one model id accepted (404 otherwise). Parameters that
// cannot be honoured (built-in tools, images, truncation "auto", background, ...) are 400
// naming them. nullopt when valid.
ParamError ParseResponsesRequest(const std::string& body, const std::string& served_model,
                                 ResponsesRequest* out);

// The conversation the model sees: `instructions` as a system message, then `turns` (each an
// array of canonical messages: the stored responses' turns oldest first, then this input), with
// each run of assistant pieces merged into one message (reasoning, then text, then tool calls).
OrderedJson MergeConversation(const std::optional<std::string>& instructions,
                              const std::vector<const OrderedJson*>& turns);

// A new id with OpenAI's shape: `prefix` ("resp_", "msg_", "fc_", "rs_") and 48 hex digits
// (192 bits from the kernel's CSPRNG: unguessable).
std::string NewResponsesId(const char* prefix);

}  // namespace specula
