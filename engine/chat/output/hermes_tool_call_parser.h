// Hermes / Qwen tool calls: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any
// number, anywhere in the content. docs/CHAT_OUTPUT.md §Hermes.
#pragma once

#include <string>
#include <string_view>

#include "engine/chat/output/tool_call_stage.h"

namespace specula::chat_output_internal {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

class HermesToolCallParser final : public ToolCallStage {
 public:
  ToolCallDelta Push(std::string_view text) override;
  ToolCallDelta Finish() override;

 private:
  // Outside a block: emits the text before the next "<tool_call>" (or before a possible start
  // of one at the end) and opens the block if the tag is there.
  void ScanText(ToolCallDelta& out);
  // Inside a block: closes it if "</tool_call>" has arrived. Returns whether it did.
  bool ScanBlock(ToolCallDelta& out);
  // Emits content, applying the separator rule: whitespace right after a parsed call, and at
  // the start of the output when a parsed call follows it, is not content.
  void EmitText(std::string_view text, ToolCallDelta& out);

  bool in_block_ = false;
  // Outside a block: text not yet emitted (a possible tag start). Inside: the block so far,
  // from "<tool_call>", kept whole so a malformed block can be given back as content.
  std::string held_;
  size_t close_search_from_ = 0;  // in a block: "</tool_call>" does not start before this
  // Whitespace held since the start of the output, when no call has been parsed yet: dropped
  // if a parsed call follows, content otherwise.
  std::string separator_;
  bool in_separator_ = true;  // no non-space content since the start or the last parsed call
  bool seen_call_ = false;
};

}  // namespace specula::chat_output_internal
