#include "engine/chat/output/llama3_json_tool_call_parser.h"

#include <utility>

#include "engine/chat/output/text_scan.h"
#include "engine/chat/output/tool_call_json.h"

namespace specula::chat_output_internal {

ToolCallDelta Llama3JsonToolCallParser::Push(std::string_view text) {
  ToolCallDelta out;
  if (state_ == State::kStreaming) {
    out.content.assign(text);
    return out;
  }
  held_.append(text);
  if (state_ == State::kStart) ResolveStart();
  if (state_ == State::kStreaming) {
    out.content = std::move(held_);
    held_.clear();
  }
  return out;
}

ToolCallDelta Llama3JsonToolCallParser::Finish() {
  ToolCallDelta out;
  if (state_ == State::kHolding) {
    if (auto calls = ParseLlama3JsonToolCalls(held_); calls.has_value()) {
      out.tool_calls = *std::move(calls);
      held_.clear();
    } else {
      ++out.malformed;  // it began as a call ({...) and did not parse as one
    }
  }
  out.content = std::move(held_);  // not calls after all (or undecided): content, unchanged
  held_.clear();
  state_ = State::kStreaming;
  return out;
}

void Llama3JsonToolCallParser::ResolveStart() {
  size_t pos = SkipSpace(held_, 0);
  const std::string_view rest = std::string_view(held_).substr(pos);
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
    pos = SkipSpace(held_, pos + kPythonTag.size());
  } else if (kPythonTag.substr(0, rest.size()) == rest) {
    return;  // "", "<", "<|python": undecided
  }
  if (pos == held_.size()) return;  // the tag, then only whitespace so far
  state_ = held_[pos] == '{' ? State::kHolding : State::kStreaming;
}

std::optional<std::vector<ParsedToolCall>> ParseLlama3JsonToolCalls(std::string_view text) {
  size_t pos = SkipSpace(text, 0);
  if (text.substr(pos, kPythonTag.size()) == kPythonTag) pos += kPythonTag.size();
  std::vector<ParsedToolCall> calls;
  const ToolCallJsonOptions options{.require_arguments = true};
  while (true) {
    pos = SkipSpace(text, pos);
    if (pos == text.size() && !calls.empty()) return calls;  // after a trailing ';'
    if (pos == text.size() || text[pos] != '{') return std::nullopt;
    const size_t end = FindJsonObjectEnd(text, pos);
    if (end == std::string_view::npos) return std::nullopt;
    std::optional<ParsedToolCall> call = ParseToolCallJson(text.substr(pos, end - pos), options);
    if (!call.has_value()) return std::nullopt;
    calls.push_back(*std::move(call));
    pos = SkipSpace(text, end);
    if (pos == text.size()) return calls;
    if (text[pos] != ';') return std::nullopt;
    ++pos;
  }
}

}  // namespace specula::chat_output_internal
