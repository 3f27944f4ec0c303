// Helpers of the chat output tests: run a parser over a text cut into chunks and collect what
// it emits.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/output/chat_output_parser.h"

namespace specula {

inline void PrintTo(const ParsedToolCall& call, std::ostream* os) {
  *os << "{" << call.name << ", " << call.arguments_json << "}";
}

namespace chat_output_testing {

// All deltas of one request, and their concatenation.
struct Collected {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;
  int malformed_tool_calls = 0;
  std::vector<ChatOutputDelta> deltas;  // one per Push, then Finish's

  bool SameOutput(const Collected& other) const {
    return content == other.content && reasoning == other.reasoning &&
           tool_calls == other.tool_calls && malformed_tool_calls == other.malformed_tool_calls;
  }
};

inline Collected RunChunks(ChatOutputFormat format, bool tools_enabled,
                           const std::vector<std::string_view>& chunks) {
  ChatOutputParser parser(format, tools_enabled);
  Collected out;
  auto add = [&out](ChatOutputDelta delta) {
    out.content += delta.content;
    out.reasoning += delta.reasoning;
    out.tool_calls.insert(out.tool_calls.end(), delta.tool_calls.begin(), delta.tool_calls.end());
    out.malformed_tool_calls += delta.malformed_tool_calls;
    out.deltas.push_back(std::move(delta));
  };
  for (std::string_view chunk : chunks) add(parser.Push(chunk));
  add(parser.Finish());
  return out;
}

inline Collected RunWhole(ChatOutputFormat format, bool tools_enabled, std::string_view text) {
  return RunChunks(format, tools_enabled, {text});
}

// `text` cut before each offset in `cuts` (ascending, within [0, size]).
inline std::vector<std::string_view> SplitAt(std::string_view text,
                                             const std::vector<size_t>& cuts) {
  std::vector<std::string_view> chunks;
  size_t begin = 0;
  for (size_t cut : cuts) {
    chunks.push_back(text.substr(begin, cut - begin));
    begin = cut;
  }
  chunks.push_back(text.substr(begin));
  return chunks;
}

// One chunk per byte: the hardest split for anything that holds text back.
inline std::vector<std::string_view> Bytes(std::string_view text) {
  std::vector<std::string_view> chunks;
  for (size_t i = 0; i < text.size(); ++i) chunks.push_back(text.substr(i, 1));
  return chunks;
}

inline ParsedToolCall Call(std::string name, std::string arguments_json) {
  return ParsedToolCall{std::move(name), std::move(arguments_json)};
}

}  // namespace chat_output_testing
}  // namespace specula
