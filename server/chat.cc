#include "server/chat.h"

#include <algorithm>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/bounded_file.h"
#include "engine/common/log.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/chat_templates.h"
#include "server/tool_constraint.h"

namespace specula {

namespace {

// The special-token strings the template may print (bos_token, eos_token).
ChatTemplateSpecialTokens SpecialTokensOf(const Tokenizer& tokenizer) {
  ChatTemplateSpecialTokens tokens;
  if (std::optional<TokenId> bos = tokenizer.bos_token_id()) {
    tokens.bos_token = tokenizer.IdToToken(*bos);
  }
  if (std::optional<TokenId> eos = tokenizer.eos_token_id()) {
    tokens.eos_token = tokenizer.IdToToken(*eos);
  }
  return tokens;
}

absl::StatusOr<std::string> ReadTemplateFile(const std::string& path) {
  return ReadBoundedFile(path, kMaxChatTemplateFileBytes, "model.chat_template");
}

bool HasToolNamed(const OrderedJson& tools, absl::string_view name) {
  if (!tools.is_array()) return false;
  for (const OrderedJson& tool : tools) {
    const OrderedJson* function = tool.contains("function") ? &tool["function"] : &tool;
    if (function->is_object() && function->value("name", std::string()) == name) return true;
  }
  return false;
}

}  // namespace

absl::Status NoChatTemplateError() {
  return absl::FailedPreconditionError(
      "this model has no chat template (no chat_template.jinja, and its tokenizer_config.json "
      "has none; or only named ones and no default): send prompt or "
      "prompt_token_ids, or start the server with model.chat_template naming a template file");
}

absl::StatusOr<ToolChoice> ParseToolChoice(absl::string_view value, const OrderedJson& tools,
                                           absl::string_view field) {
  ToolChoice choice;
  if (value.empty() || value == "auto") return choice;
  if (value == "none") {
    choice.kind = ToolChoice::Kind::kNone;
    return choice;
  }
  const bool has_tools = tools.is_array() && !tools.empty();
  if (!has_tools) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is \"", value, "\" but the request has no tools"));
  }
  if (value == "required") {
    choice.kind = ToolChoice::Kind::kRequired;
    return choice;
  }
  if (!HasToolNamed(tools, value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " names the function \"", value,
                                                   "\", which is not one of the request's tools"));
  }
  choice.kind = ToolChoice::Kind::kFunction;
  choice.function = std::string(value);
  return choice;
}

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[pick(rng)]);
  return id;
}

namespace {

// The model's format for this request: a prompt that ends in an open think block (the template
// opened it) makes the answer start inside it.
ChatOutputFormat FormatFor(ChatOutputFormat format, const RenderedChat& rendered) {
  const absl::string_view rendering =
      absl::string_view(rendered.prompt_text)
          .substr(0, rendered.prompt_text.size() - rendered.forced_prefix.size());
  format.starts_in_reasoning = format.reasoning && PromptEndsInReasoning(std::string_view(
                                                       rendering.data(), rendering.size()));
  return format;
}

// Where a reasoning model's answer starts: inside the block the prompt opened, after the block it
// may open (Qwen3 thinking), or at once (the prompt closed an empty block; no reasoning).
grammar::AnswerLead AnswerLeadOf(const ChatOutputFormat& format, std::string_view prompt) {
  if (!format.reasoning || PromptEndsAfterReasoning(prompt)) return grammar::AnswerLead::kNone;
  return PromptEndsInReasoning(prompt) ? grammar::AnswerLead::kInReasoning
                                       : grammar::AnswerLead::kOptionalReasoning;
}

}  // namespace

ChatStream::ChatStream(ChatOutputFormat format, const RenderedChat& rendered)
    : parser_(FormatFor(format, rendered), rendered.parse_tool_calls),
      max_tool_calls_(rendered.max_tool_calls) {
  // The forced start of a call is the model's answer's beginning, though the prompt holds it.
  if (!rendered.forced_prefix.empty()) {
    ChatOutputDelta held = parser_.Push(rendered.forced_prefix);
    // A well-formed prefix opens a call and yields nothing yet.
    (void)held;
  }
}

ChatDelta ChatStream::Convert(ChatOutputDelta delta) {
  ChatDelta out;
  out.content = std::move(delta.content);
  out.reasoning = std::move(delta.reasoning);
  malformed_tool_calls_ += delta.malformed_tool_calls;
  for (ParsedToolCall& call : delta.tool_calls) {
    if (max_tool_calls_ > 0 && tool_calls_ == max_tool_calls_) break;  // parallel_tool_calls false
    ++tool_calls_;
    out.tool_calls.push_back(
        {NewToolCallId(), std::move(call.name), std::move(call.arguments_json)});
  }
  if (!out.tool_calls.empty()) called_tools_ = true;
  return out;
}

ChatDelta ChatStream::Push(absl::string_view text, bool end) {
  ChatDelta out = Convert(parser_.Push(std::string_view(text.data(), text.size())));
  if (!end) return out;
  ChatDelta rest = Convert(parser_.Finish());
  out.content += rest.content;
  out.reasoning += rest.reasoning;
  for (ChatToolCall& call : rest.tool_calls) out.tool_calls.push_back(std::move(call));
  return out;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatModel::Compile(const ChatTemplates& templates,
                                                                 const std::string& name,
                                                                 const Tokenizer& tokenizer) {
  auto it = templates.by_name.find(name);
  if (it == templates.by_name.end()) return std::unique_ptr<ChatTemplate>();
  absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed =
      ChatTemplate::Create(it->second, SpecialTokensOf(tokenizer));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(templates.origin, " (", name, "): ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<ChatModel>> ChatModel::Load(const Tokenizer& tokenizer,
                                                           const std::string& template_file,
                                                           absl::string_view tool_call_syntax) {
  auto model = std::make_unique<ChatModel>();
  model->guard_ = std::make_unique<ControlTokenGuard>(tokenizer);
  ChatTemplates templates = tokenizer.chat_templates();
  if (!template_file.empty()) {
    absl::StatusOr<std::string> text = ReadTemplateFile(template_file);
    if (!text.ok()) return text.status();
    templates.by_name = {{"default", *std::move(text)}};
    templates.origin = absl::StrCat("model.chat_template '", template_file, "'");
  }
  absl::StatusOr<std::optional<ToolCallSyntax>> syntax =
      ParseToolCallSyntax(std::string_view(tool_call_syntax.data(), tool_call_syntax.size()));
  if (!syntax.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.tool_call_parser: ", syntax.status().message()));
  }
  ASSIGN_OR_RETURN(model->chat_template_, Compile(templates, "default", tokenizer));
  ASSIGN_OR_RETURN(model->tool_template_, Compile(templates, "tool_use", tokenizer));
  std::string sources;  // the output format is read off every template used
  std::vector<std::string> names;
  for (const auto& [name, source] : templates.by_name) {
    names.push_back(name);
    if (name == "default" || name == "tool_use") absl::StrAppend(&sources, source);
  }
  if (!templates.empty()) {
    Log(LogLevel::kInfo, "chat_template_loaded",
        {{"source", templates.origin}, {"templates", absl::StrJoin(names, ",")}});
  }
  if (!model->has_template()) return model;
  model->format_ = DetectChatOutputFormat(sources);
  model->thinking_switch_ = absl::StrContains(sources, "enable_thinking");
  if (syntax->has_value()) model->format_.tool_calls = **syntax;
  return model;
}

OrderedJson ChatModel::KwargsWithEffort(const ChatRequest& request) const {
  if (!request.reasoning_effort || !thinking_switch_ ||
      request.kwargs.contains("enable_thinking")) {
    return request.kwargs;  // chat_template_kwargs says it explicitly, or there is no switch
  }
  OrderedJson kwargs = request.kwargs;
  kwargs["enable_thinking"] =
      *request.reasoning_effort != "none" && *request.reasoning_effort != "minimal";
  return kwargs;
}

absl::Status CheckReasoningEffort(absl::string_view effort) {
  for (absl::string_view known : {"none", "minimal", "low", "medium", "high"}) {
    if (effort == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'reasoning_effort' must be one of none, minimal, low, medium, high, got '", effort, "'"));
}

std::string ChatModel::ForcedPrefix(const ToolChoice& choice) const {
  const bool named = choice.kind == ToolChoice::Kind::kFunction;
  // The name is JSON-escaped: a function name is the client's text.
  const std::string name = named ? OrderedJson(choice.function).dump() : "";
  switch (format_.tool_calls) {
    case ToolCallSyntax::kHermes:
      return named ? absl::StrCat("<tool_call>\n{\"name\": ", name, ", \"arguments\": ")
                   : "<tool_call>\n{\"name\": \"";
    case ToolCallSyntax::kLlama3Json:
      return named ? absl::StrCat("{\"name\": ", name, ", \"parameters\": ") : "{\"name\": \"";
    case ToolCallSyntax::kNone:
      break;
  }
  return "";
}

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> ChatModel::ClientControlRanges(
    const ChatTemplate& chat_template, const ChatRequest& request, bool tools_shown,
    std::string_view rendered) const {
  const OrderedJson no_tools;
  const OrderedJson& shown_tools = tools_shown ? request.tools : no_tools;
  OrderedJson kwargs = KwargsWithEffort(request);
  // Most conversations hold no control text: they are read, never copied.
  if (!guard_->Holds(request.messages) && !guard_->Holds(shown_tools) && !guard_->Holds(kwargs)) {
    return std::vector<std::pair<size_t, size_t>>();
  }
  OrderedJson messages = request.messages;
  OrderedJson tools = shown_tools;
  for (OrderedJson* value : {&messages, &tools, &kwargs}) guard_->Neutralize(value);
  ASSIGN_OR_RETURN(const std::string neutral,
                   chat_template.Render(messages, tools, kwargs, request.add_generation_prompt));
  return guard_->ClientRanges(rendered, neutral);
}

absl::Status CheckToolName(absl::string_view name, absl::string_view field) {
  const bool ok =
      !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
               c == '.';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "'", field, "' must be 1 to 64 letters, digits, '_', '-' or '.' (a function name)"));
}

bool ToolsShown(const ChatRequest& request) {
  return request.tools.is_array() && !request.tools.empty() &&
         request.tool_choice.kind != ToolChoice::Kind::kNone;
}

absl::StatusOr<RenderedChat> ChatModel::Render(const ChatRequest& request) const {
  const bool tools_shown = ToolsShown(request);
  // As transformers' apply_chat_template: the `tool_use` template when tools are given and the
  // model has one, else the default.
  const ChatTemplate* chat_template =
      tools_shown && tool_template_ != nullptr ? tool_template_.get() : chat_template_.get();
  if (chat_template == nullptr) return NoChatTemplateError();
  const bool forced = request.tool_choice.kind == ToolChoice::Kind::kRequired ||
                      request.tool_choice.kind == ToolChoice::Kind::kFunction;
  if (forced && format_.tool_calls == ToolCallSyntax::kNone) {
    return absl::FailedPreconditionError(
        "tool_choice requires a tool call, but this model's tool-call syntax is unknown (set "
        "model.tool_call_parser)");
  }
  absl::StatusOr<std::string> text =
      chat_template->Render(request.messages, tools_shown ? request.tools : OrderedJson(),
                            KwargsWithEffort(request), request.add_generation_prompt);
  if (!text.ok()) return text.status();
  RenderedChat rendered;
  rendered.prompt_text = *std::move(text);
  if (!request.control_tokens_in_content) {
    ASSIGN_OR_RETURN(rendered.plain_ranges, ClientControlRanges(*chat_template, request,
                                                                tools_shown, rendered.prompt_text));
  }
  rendered.answer_lead = AnswerLeadOf(format_, rendered.prompt_text);
  rendered.parse_tool_calls = tools_shown && format_.tool_calls != ToolCallSyntax::kNone;
  rendered.max_tool_calls = request.parallel_tool_calls ? 0 : 1;
  if (forced && request.add_generation_prompt) {
    // A template that opens the answer's think block (QwQ, DeepSeek-R1): the forced call starts
    // after it is closed, so the call is the answer's content, not its reasoning.
    const bool in_reasoning = format_.reasoning && PromptEndsInReasoning(rendered.prompt_text);
    rendered.forced_prefix =
        absl::StrCat(in_reasoning ? "</think>\n\n" : "", ForcedPrefix(request.tool_choice));
    rendered.prompt_text += rendered.forced_prefix;
  }
  ASSIGN_OR_RETURN(rendered.constraint, StrictToolConstraint(request, format_.tool_calls,
                                                             !rendered.forced_prefix.empty()));
  return rendered;
}

}  // namespace specula
