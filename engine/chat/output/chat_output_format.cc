// Format detection from a chat template's source, and the tool-call syntax config names.
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/output/chat_output_parser.h"
#include "engine/chat/output/hermes_tool_call_parser.h"
#include "engine/chat/output/text_scan.h"

namespace specula {
namespace {

// absl::string_view is not std::string_view in this absl build, hence std's own find / ends_with.
bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Markers of Llama 3.1's tool template: the python tag of its tool-call turns, the system line
// that enables tools, and the instruction of its JSON tool calling ("Respond in the format
// {"name": function name, "parameters": dictionary of argument name and its value}").
constexpr std::array<std::string_view, 3> kLlama3JsonMarkers = {
    "<|python_tag|>",
    "Environment: ipython",
    "\"parameters\": dictionary of argument name",
};

constexpr std::array<std::pair<std::string_view, std::optional<ToolCallSyntax>>, 4>
    kToolCallSyntaxNames = {{
        {"auto", std::nullopt},
        {"none", ToolCallSyntax::kNone},
        {"hermes", ToolCallSyntax::kHermes},
        {"llama3_json", ToolCallSyntax::kLlama3Json},
    }};

}  // namespace

ChatOutputFormat DetectChatOutputFormat(std::string_view chat_template) {
  ChatOutputFormat format;
  // Hermes first: a template that renders <tool_call> blocks is one whatever else it says.
  if (Contains(chat_template, "<tool_call>")) {
    format.tool_calls = ToolCallSyntax::kHermes;
  } else {
    for (std::string_view marker : kLlama3JsonMarkers) {
      if (Contains(chat_template, marker)) format.tool_calls = ToolCallSyntax::kLlama3Json;
    }
  }
  // DeepSeek-R1's first template only strips "</think>...": it never writes the opening tag.
  format.reasoning = Contains(chat_template, "<think>") || Contains(chat_template, "</think>");
  return format;
}

namespace {

std::string_view TrimmedEnd(std::string_view text) {
  size_t end = text.size();
  while (end > 0 && chat_output_internal::IsSpace(text[end - 1])) --end;
  return text.substr(0, end);
}

}  // namespace

bool PromptEndsInReasoning(std::string_view rendered_prompt) {
  return TrimmedEnd(rendered_prompt).ends_with("<think>");
}

bool PromptEndsAfterReasoning(std::string_view rendered_prompt) {
  return TrimmedEnd(rendered_prompt).ends_with("</think>");
}

std::string_view ToolCallOpening(ToolCallSyntax syntax) {
  return syntax == ToolCallSyntax::kHermes ? chat_output_internal::kToolCallOpen : "";
}

std::string_view ToolCallClosing(ToolCallSyntax syntax) {
  return syntax == ToolCallSyntax::kHermes ? chat_output_internal::kToolCallClose : "";
}

absl::StatusOr<std::optional<ToolCallSyntax>> ParseToolCallSyntax(std::string_view name) {
  for (const auto& [known, syntax] : kToolCallSyntaxNames) {
    if (name == known) return syntax;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool-call syntax \"", std::string(name),
                   "\" (expected auto, none, hermes or llama3_json)"));
}

}  // namespace specula
