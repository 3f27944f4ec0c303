#include "engine/tokenizer/chat_templates.h"

#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/common/bounded_file.h"
#include "engine/common/status_macros.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadTemplateFile(const fs::path& path) {
  return ReadBoundedFile(path.string(), kMaxChatTemplateFileBytes, "chat template");
}

}  // namespace

const std::string* ChatTemplates::Pick(bool with_tools) const {
  if (with_tools) {
    if (auto it = by_name.find("tool_use"); it != by_name.end()) return &it->second;
  }
  auto it = by_name.find("default");
  return it == by_name.end() ? nullptr : &it->second;
}

absl::StatusOr<ChatTemplates> ReadChatTemplateFiles(const fs::path& model_dir) {
  ChatTemplates out;
  std::error_code ec;
  const fs::path main = model_dir / "chat_template.jinja";
  if (fs::exists(main, ec)) {
    ASSIGN_OR_RETURN(out.by_name["default"], ReadTemplateFile(main));
    out.origin = main.string();
  }
  const fs::path extra = model_dir / "additional_chat_templates";
  if (!fs::is_directory(extra, ec)) return out;
  bool any = false;
  for (const fs::directory_entry& entry : fs::directory_iterator(extra, ec)) {
    if (entry.path().extension() != ".jinja") continue;
    // transformers keys them by the file's stem; the root file is the default.
    const std::string name = entry.path().stem().string();
    if (name == "default" && out.by_name.contains("default")) continue;
    ASSIGN_OR_RETURN(out.by_name[name], ReadTemplateFile(entry.path()));
    any = true;
  }
  if (ec) return absl::FailedPreconditionError(absl::StrCat(extra.string(), ": ", ec.message()));
  if (any) out.origin = out.origin.empty() ? extra.string() : absl::StrCat(out.origin, " and ", extra.string());
  return out;
}

}  // namespace specula
