// Llama 3.1's JSON-based tool calling: the whole output is {"name": ..., "parameters": {...}},
// optionally after <|python_tag|>, possibly several objects separated by ';'. Only the end of
// the output tells a call from an answer that happens to start with '{', so such output is held
// until Finish(). docs/CHAT_OUTPUT.md §Llama 3 JSON.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/output/tool_call_stage.h"

namespace specula::chat_output_internal {

inline constexpr std::string_view kPythonTag = "<|python_tag|>";

class Llama3JsonToolCallParser final : public ToolCallStage {
 public:
  ToolCallDelta Push(std::string_view text) override;
  ToolCallDelta Finish() override;

 private:
  enum class State {
    kStart,      // only whitespace / (a prefix of) <|python_tag|> so far
    kHolding,    // the output starts with '{': held until the end
    kStreaming,  // it does not: content, as it comes
  };
  // kStart: decides from the first character after whitespace and the optional python tag.
  void ResolveStart();

  State state_ = State::kStart;
  std::string held_;
};

// The calls in `text` ([whitespace] [<|python_tag|>] object (';' object)* [';']), or nullopt
// when any part of it is not a call.
std::optional<std::vector<ParsedToolCall>> ParseLlama3JsonToolCalls(std::string_view text);

}  // namespace specula::chat_output_internal
