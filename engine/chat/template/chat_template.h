// A model's chat template (tokenizer_config.json "chat_template"), rendered as Hugging Face
// transformers' apply_chat_template does: Jinja2 in an ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, its tojson, raise_exception and strftime_now, and the variables
// messages, tools, documents, add_generation_prompt and the special tokens. See
// docs/CHAT_TEMPLATES.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/template/evaluator.h"
#include "nlohmann/json.hpp"

namespace specula {

namespace jinja {
class Template;
}

struct ChatTemplateSpecialTokens {
  std::string bos_token, eos_token, unk_token, pad_token;  // "" when the model has none
};

struct ChatTemplateOptions {
  // The clock of strftime_now() (tests fix it) and the limits of a render.
  jinja::RenderOptions render;
};

// OK unless `name` is a variable ChatTemplate::Render sets itself (messages, tools, documents,
// add_generation_prompt, bos/eos/unk/pad_token); then INVALID_ARGUMENT naming
// chat_template_kwargs.<name>. A kwarg may not replace one: a forged bos_token or eos_token would
// put control tokens wherever the template prints it (transformers allows it), and a replaced
// conversation would not be the one the request sent (transformers drops it silently).
absl::Status CheckChatTemplateKwarg(std::string_view name);

class ChatTemplate {
 public:
  // Parses once at model load. Any syntax error, or any statement / filter / test / global /
  // method name the interpreter does not implement, is absl::InvalidArgumentError naming the
  // construct and its line ("chat template line 12: unsupported filter 'xmlattr'").
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(std::string_view source,
                                                              ChatTemplateSpecialTokens tokens);
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(std::string_view source,
                                                              ChatTemplateSpecialTokens tokens,
                                                              ChatTemplateOptions options);
  ~ChatTemplate();

  // Thread-safe. messages: JSON array of objects, passed through as given. tools: JSON array,
  // or null (the template sees None). kwargs: a JSON object (or null) whose keys become extra
  // variables; one CheckChatTemplateKwarg refuses is its error. A
  // raise_exception("...") is absl::InvalidArgumentError with exactly that message; other
  // errors read "chat template line N: ...".
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& kwargs,
                                     bool add_generation_prompt) const;

 private:
  ChatTemplate(std::unique_ptr<jinja::Template> tmpl, ChatTemplateSpecialTokens tokens,
               ChatTemplateOptions options);

  std::unique_ptr<jinja::Template> template_;
  ChatTemplateSpecialTokens tokens_;
  ChatTemplateOptions options_;
};

}  // namespace specula
