#include "engine/chat/template/chat_template.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/template/template.h"

namespace specula {
namespace {

using jinja::Value;
using Variables = std::vector<std::pair<std::string, Value>>;

// The variables Render sets itself.
constexpr std::string_view kOwnVariables[] = {
    "messages",  "tools",     "documents", "add_generation_prompt",
    "bos_token", "eos_token", "unk_token", "pad_token"};

}  // namespace

absl::Status CheckChatTemplateKwarg(std::string_view name) {
  for (std::string_view own : kOwnVariables) {
    if (name == own) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat_template_kwargs.", std::string(name),
          ": the server sets this template variable itself; it may not be overridden"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status AddJson(Variables& vars, std::string name, const nlohmann::ordered_json& json) {
  absl::StatusOr<Value> v = jinja::ValueFromJson(json);
  if (!v.ok()) return v.status();
  vars.emplace_back(std::move(name), *std::move(v));
  return absl::OkStatus();
}

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<jinja::Template> tmpl, ChatTemplateSpecialTokens tokens,
                           ChatTemplateOptions options)
    : template_(std::move(tmpl)), tokens_(std::move(tokens)), options_(std::move(options)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(
    std::string_view source, ChatTemplateSpecialTokens tokens) {
  return Create(source, std::move(tokens), ChatTemplateOptions());
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(std::string_view source,
                                                                   ChatTemplateSpecialTokens tokens,
                                                                   ChatTemplateOptions options) {
  jinja::ParseOptions parse;
  parse.name = "chat template";
  absl::StatusOr<std::unique_ptr<jinja::Template>> tmpl = jinja::Template::Parse(source, parse);
  if (!tmpl.ok()) return tmpl.status();
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(*std::move(tmpl), std::move(tokens), std::move(options)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 const nlohmann::ordered_json& tools,
                                                 const nlohmann::ordered_json& kwargs,
                                                 bool add_generation_prompt) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (!tools.is_array() && !tools.is_null()) {
    return absl::InvalidArgumentError("tools must be a JSON array or null");
  }
  if (!kwargs.is_object() && !kwargs.is_null()) {
    return absl::InvalidArgumentError("chat template kwargs must be a JSON object");
  }
  // transformers: {**special_tokens_map, **kwargs}, then messages, tools, documents and
  // add_generation_prompt; specula refuses kwargs that would replace any of them. A token the
  // model lacks is not in special_tokens_map: undefined.
  Variables vars;
  for (const auto& [name, token] :
       {std::pair<const char*, const std::string*>{"bos_token", &tokens_.bos_token},
        {"eos_token", &tokens_.eos_token},
        {"unk_token", &tokens_.unk_token},
        {"pad_token", &tokens_.pad_token}}) {
    if (!token->empty()) vars.emplace_back(name, Value::Str(*token));
  }
  if (kwargs.is_object()) {
    for (const auto& [key, value] : kwargs.items()) {
      if (absl::Status s = CheckChatTemplateKwarg(key); !s.ok()) return s;
      if (absl::Status s = AddJson(vars, key, value); !s.ok()) return s;
    }
  }
  if (absl::Status s = AddJson(vars, "messages", messages); !s.ok()) return s;
  if (absl::Status s = AddJson(vars, "tools", tools); !s.ok()) return s;
  vars.emplace_back("documents", Value::None());
  vars.emplace_back("add_generation_prompt", Value::Bool(add_generation_prompt));
  return template_->Render(std::move(vars), options_.render);
}

}  // namespace specula
