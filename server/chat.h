// Chat requests (docs/CHAT.md): a conversation rendered into the prompt by the model's own chat
// template, and the model's answer split back into content, reasoning and tool calls. Shared by
// the gRPC service and the OpenAI-compatible HTTP endpoint, which both translate their wire
// format into a ChatRequest.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat/output/chat_output_parser.h"
#include "engine/chat/template/chat_template.h"
#include "engine/generate/sequence.h"
#include "engine/grammar/answer_lead.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/control_token_guard.h"
#include "server/request_json.h"

namespace specula {

// Which tool the model must call, if any (OpenAI's tool_choice).
struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kFunction };
  Kind kind = Kind::kAuto;
  std::string function;  // kFunction: the function's name
};

// Parses the API's spelling: "" or "auto", "none", "required", or a function's name (which must
// be one of `tools`' names). INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<ToolChoice> ParseToolChoice(absl::string_view value, const OrderedJson& tools,
                                           absl::string_view field);

// A conversation as the chat template sees it (transformers' apply_chat_template arguments).
struct ChatRequest {
  OrderedJson messages = OrderedJson::array();  // [{"role", "content", ...}]
  OrderedJson tools;                            // null, or [{"type": "function", "function"}]
  // The tools whose calls must follow their parameters schema (OpenAI's strict: true), by name.
  absl::flat_hash_set<std::string> strict_tools;
  OrderedJson kwargs = OrderedJson::object();  // extra template variables
  ToolChoice tool_choice;
  bool add_generation_prompt = true;
  // OpenAI's parallel_tool_calls: false keeps an answer to its first tool call.
  bool parallel_tool_calls = true;
  // OpenAI's reasoning_effort: "none" and "minimal" turn the template's thinking switch off,
  // "low", "medium" and "high" on, where the template has one (Qwen3's enable_thinking) and
  // `kwargs` does not set it; ignored otherwise.
  std::optional<std::string> reasoning_effort;
  // Control-token text in the client's strings becomes control tokens (transformers' behaviour);
  // by default it is ordinary text (server/control_token_guard.h).
  bool control_tokens_in_content = false;
};

// A tool's name as OpenAI allows it: 1 to 64 of A-Z a-z 0-9 _ - (and "."). The name is written
// into the prompt and the forced call's prefix, and keys compiled grammars: nothing else may
// reach them. INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckToolName(absl::string_view name, absl::string_view field);

// Whether the request's tools reach the model (some are given and tool_choice is not "none").
bool ToolsShown(const ChatRequest& request);

// OK for the reasoning_effort values OpenAI defines (none, minimal, low, medium, high);
// INVALID_ARGUMENT naming the parameter otherwise.
absl::Status CheckReasoningEffort(absl::string_view effort);

// A rendered conversation.
struct RenderedChat {
  // What is tokenized (without adding special tokens: the template writes them): the template's
  // rendering, then `forced_prefix`.
  std::string prompt_text;
  // The start of a tool call appended for tool_choice required / a named function, so the model
  // can only continue it. The output parser reads it as the start of the model's answer.
  std::string forced_prefix;
  // Whether tool calls are parsed out of the answer (the request has tools, tool_choice not none,
  // and the model has a tool-call syntax).
  bool parse_tool_calls = false;
  // The most tool calls the answer returns (later ones are dropped); 0 = any number.
  int32_t max_tool_calls = 0;
  // What holds strict tools' calls to their schemas (server/tool_constraint.h); empty when no
  // shown tool is strict.
  ConstraintSpec constraint;
  // Byte ranges of prompt_text where control-token text came from the client: tokenized as
  // ordinary text (EncodeOptions::plain_ranges).
  std::vector<std::pair<size_t, size_t>> plain_ranges;
  // What the model writes before its answer (a reasoning model's think block): an output
  // constraint (a response format) holds the answer after it.
  grammar::AnswerLead answer_lead = grammar::AnswerLead::kNone;
};

// A tool call with the id the server gave it.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, compact
};

// What a chat answer adds at one point of the stream.
struct ChatDelta {
  std::string content;
  std::string reasoning;
  std::vector<ChatToolCall> tool_calls;
};

// One request's answer, parsed as it streams. Not thread-safe: one consumer.
class ChatStream {
 public:
  ChatStream(ChatOutputFormat format, const RenderedChat& rendered);
  // The next text of the answer. With `end`, also everything held back (an unfinished tool call
  // becomes content).
  ChatDelta Push(absl::string_view text, bool end);
  // Whether any tool call was returned (finish reason "tool_calls").
  bool called_tools() const { return called_tools_; }
  // Whether an answer that ended with `finish` is reported as ending in tool calls (OpenAI's
  // finish_reason "tool_calls", gRPC's TOOL_CALLS): it called tools and stopped by itself (a
  // length cut or a stop sequence keeps its own reason).
  bool EndedInToolCalls(FinishReason finish) const {
    return called_tools_ && finish == FinishReason::kStop;
  }
  // Tool calls the model began that did not parse (returned as content):
  // specula_tool_call_parse_failures_total.
  int malformed_tool_calls() const { return malformed_tool_calls_; }

 private:
  ChatDelta Convert(ChatOutputDelta delta);

  ChatOutputParser parser_;
  int32_t max_tool_calls_ = 0;
  int32_t tool_calls_ = 0;  // returned so far
  bool called_tools_ = false;
  int malformed_tool_calls_ = 0;
};

// FAILED_PRECONDITION: a chat request to a model without a chat template.
absl::Status NoChatTemplateError();

// A new tool-call id: "call_" and 24 random alphanumerics.
std::string NewToolCallId();

// The model's chat template and its answer format; one per server, used from any thread.
class ChatModel {
 public:
  // `template_file`: model.chat_template ("" = the model's own templates, if any: its template
  // files, else tokenizer_config.json's; engine/tokenizer/chat_templates.h).
  // `tool_call_syntax`: model.tool_call_parser ("auto" detects it from the template). Errors
  // (an unreadable file, a template using what the interpreter does not implement) name the
  // config key or file and the construct.
  static absl::StatusOr<std::unique_ptr<ChatModel>> Load(const Tokenizer& tokenizer,
                                                         const std::string& template_file,
                                                         absl::string_view tool_call_syntax);

  bool has_template() const { return chat_template_ != nullptr || tool_template_ != nullptr; }
  const ChatOutputFormat& output_format() const { return format_; }

  // FAILED_PRECONDITION when the model has no template; INVALID_ARGUMENT when the template
  // refuses the conversation (raise_exception: e.g. roles that do not alternate).
  absl::StatusOr<RenderedChat> Render(const ChatRequest& request) const;

 private:
  // The text that starts a call for `choice` in this model's tool-call syntax.
  std::string ForcedPrefix(const ToolChoice& choice) const;
  // The template variables: the request's kwargs, with enable_thinking from reasoning_effort
  // where the template has that switch and the kwargs do not set it.
  OrderedJson KwargsWithEffort(const ChatRequest& request) const;

  // Where the client's strings put control-token text into `rendered` (the template's
  // rendering of `request`), unless the request lets it be control tokens.
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> ClientControlRanges(
      const ChatTemplate& chat_template, const ChatRequest& request, bool tools_shown,
      std::string_view rendered) const;

  // The named template of `templates`, compiled; null when it has none of that name.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Compile(const ChatTemplates& templates,
                                                               const std::string& name,
                                                               const Tokenizer& tokenizer);

  std::unique_ptr<ChatTemplate> chat_template_;  // "default"
  std::unique_ptr<ChatTemplate> tool_template_;  // "tool_use", for requests with tools
  ChatOutputFormat format_;
  bool thinking_switch_ = false;  // a template reads `enable_thinking` (reasoning_effort)
  std::unique_ptr<ControlTokenGuard> guard_;
};

}  // namespace specula
