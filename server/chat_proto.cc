#include "server/chat_proto.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/compiled_constraints.h"

namespace specula {
namespace {

// Parses `text` as a JSON object; INVALID_ARGUMENT naming `field`.
absl::StatusOr<OrderedJson> ParseObject(const std::string& text, absl::string_view field) {
  absl::StatusOr<OrderedJson> value = ParseRequestJson(text, field);
  if (!value.ok()) return value.status();
  if (!value->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": not a JSON object"));
  }
  return value;
}

absl::StatusOr<OrderedJson> ToolCallJson(const v1::ToolCall& call, absl::string_view field) {
  if (call.name().empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".name is empty"));
  OrderedJson arguments = OrderedJson::object();
  if (!call.arguments().empty()) {
    absl::StatusOr<OrderedJson> parsed =
        ParseObject(call.arguments(), absl::StrCat(field, ".arguments"));
    if (!parsed.ok()) return parsed.status();
    arguments = *std::move(parsed);
  }
  // transformers' documented shape; templates read tool_call.function.arguments as a mapping.
  OrderedJson out = OrderedJson::object();
  if (!call.id().empty()) out["id"] = call.id();
  out["type"] = "function";
  out["function"] = {{"name", call.name()}, {"arguments", std::move(arguments)}};
  return out;
}

absl::StatusOr<OrderedJson> MessageJson(const v1::ChatMessage& m, int index) {
  const std::string field = absl::StrFormat("messages[%d]", index);
  if (m.role().empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".role is empty"));
  OrderedJson out = OrderedJson::object();
  out["role"] = m.role();
  // Absent content is "" to the template, as on the HTTP path (openai_request.cc).
  out["content"] = m.content();
  if (!m.name().empty()) out["name"] = m.name();
  if (m.tool_calls_size() > 0) {
    OrderedJson calls = OrderedJson::array();
    for (int i = 0; i < m.tool_calls_size(); ++i) {
      absl::StatusOr<OrderedJson> call =
          ToolCallJson(m.tool_calls(i), absl::StrFormat("%s.tool_calls[%d]", field, i));
      if (!call.ok()) return call.status();
      calls.push_back(*std::move(call));
    }
    out["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id().empty()) out["tool_call_id"] = m.tool_call_id();
  if (!m.reasoning_content().empty()) out["reasoning_content"] = m.reasoning_content();
  return out;
}

absl::StatusOr<OrderedJson> ToolJson(const v1::Tool& tool, int index) {
  const std::string field = absl::StrFormat("tools[%d]", index);
  if (absl::Status s = CheckToolName(tool.name(), absl::StrCat(field, ".name")); !s.ok()) return s;
  OrderedJson function = OrderedJson::object();
  function["name"] = tool.name();
  if (!tool.description().empty()) function["description"] = tool.description();
  if (!tool.parameters().empty()) {
    absl::StatusOr<OrderedJson> schema =
        ParseObject(tool.parameters(), absl::StrCat(field, ".parameters"));
    if (!schema.ok()) return schema.status();
    function["parameters"] = *std::move(schema);
  }
  return OrderedJson{{"type", "function"}, {"function", std::move(function)}};
}

}  // namespace

absl::StatusOr<ChatRequest> ToChatRequest(const ProtoMessages& messages, const ProtoTools& tools,
                                          const std::string& tool_choice,
                                          const std::string& chat_template_kwargs) {
  ChatRequest out;
  for (int i = 0; i < messages.size(); ++i) {
    absl::StatusOr<OrderedJson> m = MessageJson(messages[i], i);
    if (!m.ok()) return m.status();
    out.messages.push_back(*std::move(m));
  }
  if (!tools.empty()) {
    out.tools = OrderedJson::array();
    for (int i = 0; i < tools.size(); ++i) {
      absl::StatusOr<OrderedJson> t = ToolJson(tools[i], i);
      if (!t.ok()) return t.status();
      out.tools.push_back(*std::move(t));
      if (tools[i].strict()) out.strict_tools.insert(tools[i].name());
    }
  }
  absl::StatusOr<ToolChoice> choice = ParseToolChoice(tool_choice, out.tools, "tool_choice");
  if (!choice.ok()) return choice.status();
  out.tool_choice = *std::move(choice);
  if (!chat_template_kwargs.empty()) {
    absl::StatusOr<OrderedJson> kwargs = ParseObject(chat_template_kwargs, "chat_template_kwargs");
    if (!kwargs.ok()) return kwargs.status();
    out.kwargs = *std::move(kwargs);
  }
  return out;
}

absl::StatusOr<std::optional<RenderedChat>> ApplyChatTemplate(const ChatModel* chat,
                                                              v1::GenerateRequest* request) {
  const bool chat_only_fields = request->tools_size() > 0 || !request->tool_choice().empty() ||
                                !request->chat_template_kwargs().empty();
  if (request->messages().empty()) {
    if (chat_only_fields) {
      return absl::InvalidArgumentError(
          "tools, tool_choice and chat_template_kwargs apply to messages only");
    }
    return std::nullopt;
  }
  if (request->has_prompt() || request->has_prompt_token_ids()) {
    return absl::InvalidArgumentError(
        "set exactly one of prompt, prompt_token_ids and messages, not several");
  }
  if (chat == nullptr || !chat->has_template()) return NoChatTemplateError();
  absl::StatusOr<ChatRequest> converted =
      ToChatRequest(request->messages(), request->tools(), request->tool_choice(),
                    request->chat_template_kwargs());
  if (!converted.ok()) return converted.status();
  converted->control_tokens_in_content = request->control_tokens_in_content();
  // The constraint holds from the first token, so a tool call could never be written.
  if (Constrains(request->output_constraint()) && ToolsShown(*converted)) {
    return absl::InvalidArgumentError(
        "output_constraint together with tools is not supported yet (the model could not call "
        "them); set tool_choice \"none\" or leave one out");
  }
  absl::StatusOr<RenderedChat> rendered = chat->Render(*converted);
  if (!rendered.ok()) return rendered.status();
  request->set_prompt(rendered->prompt_text);
  // apply_chat_template(tokenize=True) adds no special tokens: the template wrote them.
  request->set_add_special_tokens(false);
  request->clear_messages();
  request->clear_tools();
  return *std::move(rendered);
}

void FillChatDelta(ChatDelta delta, v1::GenerateResponse* response) {
  response->set_text(std::move(delta.content));
  response->set_reasoning_text(std::move(delta.reasoning));
  for (ChatToolCall& call : delta.tool_calls) {
    v1::ToolCall* out = response->add_tool_calls();
    out->set_id(std::move(call.id));
    out->set_name(std::move(call.name));
    out->set_arguments(std::move(call.arguments));
  }
}

}  // namespace specula
