// The gRPC API's chat fields (GenerateRequest / TokenizeRequest .messages, .tools, .tool_choice,
// .chat_template_kwargs) translated into a ChatRequest, and parsed answers back into protos.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "server/chat.h"
#include "specula/v1/specula.pb.h"

namespace specula {

using ProtoMessages = google::protobuf::RepeatedPtrField<v1::ChatMessage>;
using ProtoTools = google::protobuf::RepeatedPtrField<v1::Tool>;

// INVALID_ARGUMENT naming the field ("messages[2].tool_calls[0].arguments: not a JSON object").
absl::StatusOr<ChatRequest> ToChatRequest(const ProtoMessages& messages, const ProtoTools& tools,
                                          const std::string& tool_choice,
                                          const std::string& chat_template_kwargs);

// For a request with messages: checks that it has no other input, renders the conversation and
// puts the text in request->prompt (tokenized without adding special tokens: the template wrote
// them), so the rest of the request path is the prompt's. nullopt for a request without messages.
absl::StatusOr<std::optional<RenderedChat>> ApplyChatTemplate(const ChatModel* chat,
                                                              v1::GenerateRequest* request);

// Copies a parsed delta into a stream message: content into text (replacing the raw text),
// reasoning and tool calls into their fields.
void FillChatDelta(ChatDelta delta, v1::GenerateResponse* response);

}  // namespace specula
