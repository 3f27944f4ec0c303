#include "engine/chat/output/tool_call_json.h"

#include <string>

#include "nlohmann/json.hpp"

namespace specula::chat_output_internal {
namespace {

using Json = nlohmann::ordered_json;  // keeps the model's key order in arguments_json

std::optional<Json> ParseJson(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return std::nullopt;
  return json;
}

// The arguments object of `call`: {} when absent (if allowed); a string is parsed, since some
// models write the arguments as a JSON-encoded string as the OpenAI API does.
std::optional<Json> ArgumentsOf(const Json& call, const ToolCallJsonOptions& options) {
  auto it = call.find("arguments");
  if (it == call.end()) it = call.find("parameters");
  if (it == call.end()) {
    if (options.require_arguments) return std::nullopt;
    return Json::object();
  }
  if (it->is_object()) return *it;
  if (!it->is_string()) return std::nullopt;
  std::optional<Json> parsed = ParseJson(it->get_ref<const std::string&>());
  if (!parsed.has_value() || !parsed->is_object()) return std::nullopt;
  return parsed;
}

}  // namespace

std::optional<ParsedToolCall> ParseToolCallJson(std::string_view text,
                                                const ToolCallJsonOptions& options) {
  std::optional<Json> call = ParseJson(text);
  if (!call.has_value() || !call->is_object()) return std::nullopt;
  auto name = call->find("name");
  if (name == call->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return std::nullopt;
  }
  std::optional<Json> arguments = ArgumentsOf(*call, options);
  if (!arguments.has_value()) return std::nullopt;
  // Compact; invalid UTF-8 cannot reach here (the parser rejects it), `replace` is a backstop so
  // dump() never throws.
  return ParsedToolCall{name->get<std::string>(),
                        arguments->dump(-1, ' ', false, Json::error_handler_t::replace)};
}

size_t FindJsonObjectEnd(std::string_view text, size_t begin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace specula::chat_output_internal
