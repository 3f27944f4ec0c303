// Splits the text a chat model generates into content, reasoning text and tool calls, as it
// streams: the front ends push each detokenized chunk and send on what comes back. The formats
// and every rule are in docs/CHAT_OUTPUT.md. Knows nothing of gRPC, HTTP or tokens.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

enum class ToolCallSyntax {
  kNone,        // no tool calls: everything outside reasoning is content
  kHermes,      // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen, Hermes)
  kLlama3Json,  // the whole output is {"name": ..., "parameters": {...}} (Llama 3.1+)
};

struct ChatOutputFormat {
  ToolCallSyntax tool_calls = ToolCallSyntax::kNone;
  bool reasoning = false;            // <think>…</think> handling
  bool starts_in_reasoning = false;  // the prompt ended inside a think block
};

// Picks the format from a chat template's source text: "<tool_call>" -> kHermes; else
// "<|python_tag|>", "Environment: ipython" or Llama 3.1's JSON tool-call instruction ("parameters":
// dictionary of argument name ...) -> kLlama3Json; "<think>" or "</think>" -> reasoning.
// starts_in_reasoning is never set here: it depends on the rendered prompt (see
// PromptEndsInReasoning).
ChatOutputFormat DetectChatOutputFormat(std::string_view chat_template);

// True when the rendered prompt, trailing whitespace aside, ends with "<think>": the template
// opened the think block itself (DeepSeek-R1, QwQ), so the output starts inside it. The caller
// sets ChatOutputFormat::starts_in_reasoning from this per request.
bool PromptEndsInReasoning(std::string_view rendered_prompt);
// True when it ends, trailing whitespace aside, with "</think>": the template wrote an empty block
// for the model (Qwen3 with enable_thinking false), so the output is the answer alone.
bool PromptEndsAfterReasoning(std::string_view rendered_prompt);

// Parses a config value: "auto" (nullopt: use DetectChatOutputFormat), "none", "hermes",
// "llama3_json"; anything else is InvalidArgument.
absl::StatusOr<std::optional<ToolCallSyntax>> ParseToolCallSyntax(std::string_view name);

// The text that opens a tool call in `syntax` ("<tool_call>" for Hermes), or "" when calls have
// no opening of their own (Llama 3.1 JSON: the answer is the call).
std::string_view ToolCallOpening(ToolCallSyntax syntax);
// The text that closes it ("</tool_call>" for Hermes), or "".
std::string_view ToolCallClosing(ToolCallSyntax syntax);

struct ParsedToolCall {
  std::string name;
  std::string arguments_json;  // compact JSON object, keys in the order the model wrote them

  bool operator==(const ParsedToolCall&) const = default;
};

struct ChatOutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ParsedToolCall> tool_calls;
  // Tool calls the model began that did not parse: their text is in `content`.
  int malformed_tool_calls = 0;

  bool empty() const;
};

namespace chat_output_internal {
class ReasoningSplitter;
class ToolCallStage;
}  // namespace chat_output_internal

// One per request; not thread-safe. Move-only.
class ChatOutputParser {
 public:
  // tools_enabled=false (the request has no tools, or tool_choice none): tool-call syntax is
  // not parsed and everything is content (reasoning still split).
  ChatOutputParser(ChatOutputFormat format, bool tools_enabled);
  ~ChatOutputParser();
  ChatOutputParser(ChatOutputParser&&) noexcept;
  ChatOutputParser& operator=(ChatOutputParser&&) noexcept;

  // Feeds the next chunk of generated text (complete UTF-8). Returns what can be emitted now:
  // content/reasoning that can no longer turn out to be part of a tag or tool call; a tool call
  // as soon as its closing tag arrives. Text that might be the beginning of a tag ("<tool_" at
  // the end of a chunk) is held back until the next chunk decides it — never emitted twice,
  // never lost. Within one delta, the order of content relative to tool calls is not kept.
  ChatOutputDelta Push(std::string_view text);

  // End of generation: flushes everything held (unterminated blocks become content, or
  // reasoning for an unterminated think block). Call once; nothing may be pushed after it.
  ChatOutputDelta Finish();

 private:
  std::unique_ptr<chat_output_internal::ReasoningSplitter> reasoning_;
  std::unique_ptr<chat_output_internal::ToolCallStage> tools_;
};

}  // namespace specula
