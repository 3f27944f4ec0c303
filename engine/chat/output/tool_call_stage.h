// Second stage of the output parser: finds tool calls in the content the reasoning stage lets
// through. One implementation per ToolCallSyntax.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/output/chat_output_parser.h"

namespace specula::chat_output_internal {

struct ToolCallDelta {
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  int malformed = 0;  // call blocks that did not parse (given back as content)
};

class ToolCallStage {
 public:
  virtual ~ToolCallStage() = default;
  // The next piece of content; returns what can be emitted now.
  virtual ToolCallDelta Push(std::string_view text) = 0;
  // End of the content: everything still held.
  virtual ToolCallDelta Finish() = 0;
};

// kNone, or a request without tools: content passes through unchanged.
class NoToolCalls final : public ToolCallStage {
 public:
  ToolCallDelta Push(std::string_view text) override { return {std::string(text), {}}; }
  ToolCallDelta Finish() override { return {}; }
};

// The stage for `syntax` (NoToolCalls when tools are disabled).
std::unique_ptr<ToolCallStage> MakeToolCallStage(ToolCallSyntax syntax, bool tools_enabled);

}  // namespace specula::chat_output_internal
