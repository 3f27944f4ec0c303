// Grammars for strict tool calls (OpenAI's `strict: true` function tools): a call written as the
// JSON object {"name": NAME, "<arguments key>": ARGUMENTS}, where NAME is one of the tools and
// ARGUMENTS a JSON text valid against that tool's parameters schema (any JSON object for a tool
// that is not strict). The object's layout is the Hermes / Qwen ("arguments") and Llama 3.1 JSON
// ("parameters") tool-call syntaxes'. The opening tag is not in the grammar (the caller starts the
// constraint after it); the closing one is (`closing`, after optional whitespace), so that a
// call the model writes under the grammar is always complete.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"
#include "nlohmann/json.hpp"

namespace specula::grammar {

struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON Schema; null = an object with no properties
  bool strict = false;                // false: any JSON object
};

// Where the call's text starts: the whole object (optional whitespace first), after an opening
// `{"name": "` the server wrote (tool_choice required), or after `..., "<arguments key>": ` (a
// named function: `tools` holds that one tool). Each ends with the object's closing brace and
// then `closing`.
enum class ToolCallStart { kObject, kAfterNameQuote, kArguments };

struct ToolCallGrammarOptions {
  ToolCallStart start = ToolCallStart::kObject;
  std::string arguments_key = "arguments";
  std::string closing;     // e.g. "</tool_call>"; "" = the object is the whole call
  JsonSchemaOptions json;  // `strict` is per tool
};

// INVALID_ARGUMENT naming the tool and the schema keyword it cannot honour; for kArguments,
// `tools` must hold exactly one tool.
absl::StatusOr<std::shared_ptr<const Grammar>> ToolCallGrammar(
    const std::vector<ToolSchema>& tools, const ToolCallGrammarOptions& options);

}  // namespace specula::grammar
