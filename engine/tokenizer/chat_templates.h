// A model's chat templates, found where transformers looks for them. transformers 5 saves the
// default template to `chat_template.jinja` and named ones (e.g. `tool_use`) to
// `additional_chat_templates/<name>.jinja`; older checkpoints embed them in tokenizer_config.json
// (`chat_template`: one string, or a list of {name, template}). As in transformers'
// from_pretrained, template files, when any exist, replace every template of
// tokenizer_config.json.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace specula {

struct ChatTemplates {
  std::map<std::string, std::string> by_name;  // name -> Jinja source; one template is "default"
  std::string origin;                          // where they were read, for logs and errors

  // The template transformers' apply_chat_template picks: `tool_use` when tools are given and
  // the model has one, else `default`; nullptr when neither exists.
  const std::string* Pick(bool with_tools) const;
  bool empty() const { return by_name.empty(); }
};

// The largest template file read; a real one is a few KiB.
inline constexpr size_t kMaxChatTemplateFileBytes = 1 << 20;

// The template files of `model_dir`; an empty set when it has none. A file that is not a
// regular file, is larger than kMaxChatTemplateFileBytes or cannot be read is an error naming it.
absl::StatusOr<ChatTemplates> ReadChatTemplateFiles(const std::filesystem::path& model_dir);

}  // namespace specula
