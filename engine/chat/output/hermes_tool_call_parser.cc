#include "engine/chat/output/hermes_tool_call_parser.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "engine/chat/output/text_scan.h"
#include "engine/chat/output/tool_call_json.h"

namespace specula::chat_output_internal {

ToolCallDelta HermesToolCallParser::Push(std::string_view text) {
  ToolCallDelta out;
  held_.append(text);
  // One chunk may hold several blocks and the text between them.
  while (true) {
    if (!in_block_) ScanText(out);
    if (!in_block_ || !ScanBlock(out)) break;
  }
  return out;
}

ToolCallDelta HermesToolCallParser::Finish() {
  ToolCallDelta out;
  // An unterminated block, or a partial "<tool_call", is content.
  if (in_block_) ++out.malformed;
  EmitText(held_, out);
  held_.clear();
  in_block_ = false;
  if (in_separator_ && !seen_call_) out.content.append(separator_);
  separator_.clear();
  return out;
}

void HermesToolCallParser::ScanText(ToolCallDelta& out) {
  const size_t open = held_.find(kToolCallOpen);
  if (open == std::string::npos) {
    const size_t emit = held_.size() - PartialTagLength(held_, kToolCallOpen);
    EmitText(std::string_view(held_).substr(0, emit), out);
    held_.erase(0, emit);
    return;
  }
  EmitText(std::string_view(held_).substr(0, open), out);
  held_.erase(0, open);
  in_block_ = true;
  close_search_from_ = kToolCallOpen.size();
}

bool HermesToolCallParser::ScanBlock(ToolCallDelta& out) {
  const size_t close = held_.find(kToolCallClose, close_search_from_);
  if (close == std::string::npos) {
    // The tag may straddle chunks: next time, look from where it could still begin.
    const size_t tail = kToolCallClose.size() - 1;
    close_search_from_ =
        std::max(close_search_from_, held_.size() > tail ? held_.size() - tail : 0);
    return false;
  }
  const size_t end = close + kToolCallClose.size();
  const std::string_view body =
      std::string_view(held_).substr(kToolCallOpen.size(), close - kToolCallOpen.size());
  std::optional<ParsedToolCall> call = ParseToolCallJson(body, ToolCallJsonOptions{});
  if (call.has_value()) {
    out.tool_calls.push_back(*std::move(call));
    separator_.clear();
    in_separator_ = true;
    seen_call_ = true;
  } else {
    EmitText(std::string_view(held_).substr(0, end), out);  // malformed: the block is content
    ++out.malformed;
  }
  held_.erase(0, end);
  in_block_ = false;
  return true;
}

void HermesToolCallParser::EmitText(std::string_view text, ToolCallDelta& out) {
  if (in_separator_) {
    const size_t first = SkipSpace(text, 0);
    // After a call the separator is dropped outright; at the start it waits for what follows.
    if (!seen_call_) separator_.append(text.substr(0, first));
    if (first == text.size()) return;
    if (!seen_call_) out.content.append(separator_);
    separator_.clear();
    in_separator_ = false;
    text.remove_prefix(first);
  }
  out.content.append(text);
}

}  // namespace specula::chat_output_internal
