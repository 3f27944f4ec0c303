#include "engine/chat/output/chat_output_parser.h"

#include <utility>

#include "engine/chat/output/hermes_tool_call_parser.h"
#include "engine/chat/output/llama3_json_tool_call_parser.h"
#include "engine/chat/output/reasoning_splitter.h"
#include "engine/chat/output/tool_call_stage.h"

namespace specula {
namespace chat_output_internal {

std::unique_ptr<ToolCallStage> MakeToolCallStage(ToolCallSyntax syntax, bool tools_enabled) {
  if (!tools_enabled) return std::make_unique<NoToolCalls>();
  switch (syntax) {
    case ToolCallSyntax::kHermes:
      return std::make_unique<HermesToolCallParser>();
    case ToolCallSyntax::kLlama3Json:
      return std::make_unique<Llama3JsonToolCallParser>();
    case ToolCallSyntax::kNone:
      break;
  }
  return std::make_unique<NoToolCalls>();
}

}  // namespace chat_output_internal

namespace {

// Adds the tool stage's output for the content the reasoning stage let through.
void Append(chat_output_internal::ToolCallDelta tools, ChatOutputDelta& out) {
  out.content.append(tools.content);
  for (ParsedToolCall& call : tools.tool_calls) out.tool_calls.push_back(std::move(call));
  out.malformed_tool_calls += tools.malformed;
}

}  // namespace

bool ChatOutputDelta::empty() const {
  return content.empty() && reasoning.empty() && tool_calls.empty();
}

ChatOutputParser::ChatOutputParser(ChatOutputFormat format, bool tools_enabled)
    : reasoning_(std::make_unique<chat_output_internal::ReasoningSplitter>(
          format.reasoning, format.starts_in_reasoning)),
      tools_(chat_output_internal::MakeToolCallStage(format.tool_calls, tools_enabled)) {}

ChatOutputParser::~ChatOutputParser() = default;
ChatOutputParser::ChatOutputParser(ChatOutputParser&&) noexcept = default;
ChatOutputParser& ChatOutputParser::operator=(ChatOutputParser&&) noexcept = default;

ChatOutputDelta ChatOutputParser::Push(std::string_view text) {
  chat_output_internal::ReasoningDelta split = reasoning_->Push(text);
  ChatOutputDelta out;
  out.reasoning = std::move(split.reasoning);
  if (!split.content.empty()) Append(tools_->Push(split.content), out);
  return out;
}

ChatOutputDelta ChatOutputParser::Finish() {
  chat_output_internal::ReasoningDelta split = reasoning_->Finish();
  ChatOutputDelta out;
  out.reasoning = std::move(split.reasoning);
  if (!split.content.empty()) Append(tools_->Push(split.content), out);
  Append(tools_->Finish(), out);
  return out;
}

}  // namespace specula
