// Turns the JSON a model writes for a tool call into a ParsedToolCall, shared by the Hermes and
// Llama 3 JSON syntaxes.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "engine/chat/output/chat_output_parser.h"

namespace specula::chat_output_internal {

struct ToolCallJsonOptions {
  // Llama 3 JSON: the object must carry "parameters" or "arguments", or any JSON answer with a
  // "name" key ({"name": "Alice"}) would pass for a call. Hermes tags are explicit enough that
  // a call without arguments means {}.
  bool require_arguments = false;
};

// Parses `text` (exactly one JSON value, whitespace around it allowed) as a call object
// {"name": string, "arguments" | "parameters": object | string holding a JSON object}. nullopt
// when it is not valid JSON or not such an object.
std::optional<ParsedToolCall> ParseToolCallJson(std::string_view text,
                                                const ToolCallJsonOptions& options);

// `text[begin]` is '{': the index just past the '}' that closes it, matching braces and brackets
// outside strings; npos when the text ends first. Does not validate the JSON in between.
size_t FindJsonObjectEnd(std::string_view text, size_t begin);

}  // namespace specula::chat_output_internal
