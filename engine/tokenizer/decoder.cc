// PostProcessor and DecoderSpec from pipeline.h.
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specula::tokenizer_internal {
namespace {

using json = nlohmann::json;


absl::Status AddPostProcessor(const json& config, const std::string& file,
                              std::vector<std::vector<json>>* templates) {
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    for (const auto& sub : config.at("processors")) {
      RETURN_IF_ERROR(AddPostProcessor(sub, file, templates));
    }
  } else if (type == "TemplateProcessing") {
    templates->emplace_back();
    for (const auto& item : config.at("single")) templates->back().push_back(item);
    // special_tokens travel with each item for lookup below.
    templates->back().push_back(config.at("special_tokens"));
  } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets
    return Unsupported(file, "post_processor", type);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PostProcessor> PostProcessor::FromJson(const json& config, const std::string& file) {
  PostProcessor p;
  if (config.is_null()) return p;
  std::vector<std::vector<json>> raw;
  RETURN_IF_ERROR(AddPostProcessor(config, file, &raw));
  for (auto& items : raw) {
    const json specials = items.back();
    items.pop_back();
    std::vector<Item> tmpl;
    for (const json& item : items) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].at("id").get<std::string>() != "A") {
          return absl::InvalidArgumentError(
              absl::StrCat(file, ": TemplateProcessing single template uses sequence B"));
        }
        tmpl.push_back({true, {}});
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        const auto it = specials.find(name);
        if (it == specials.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(file, ": TemplateProcessing special token \"", name, "\" has no ids"));
        }
        tmpl.push_back({false, it->at("ids").get<std::vector<TokenId>>()});
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": malformed TemplateProcessing item ", item.dump()));
      }
    }
    p.templates_.push_back(std::move(tmpl));
  }
  return p;
}

std::vector<TokenId> PostProcessor::Apply(std::vector<TokenId> ids) const {
  for (const auto& tmpl : templates_) {
    std::vector<TokenId> out;
    out.reserve(ids.size() + 4);
    for (const Item& item : tmpl) {
      const auto& src = item.sequence ? ids : item.ids;
      out.insert(out.end(), src.begin(), src.end());
    }
    ids = std::move(out);
  }
  return ids;
}

std::optional<TokenId> PostProcessor::leading_special() const {
  if (templates_.empty() || templates_[0].empty()) return std::nullopt;
  const Item& first = templates_[0][0];
  if (first.sequence || first.ids.size() != 1) return std::nullopt;
  return first.ids[0];
}

// ---------------------------------------------------------------------------------------------
// DecoderSpec

absl::StatusOr<DecoderSpec> DecoderSpec::FromJson(const json& config, const std::string& file) {
  DecoderSpec d;
  bool fused = false;
  if (!config.is_null()) RETURN_IF_ERROR(d.Add(config, file, &fused));
  return d;
}

absl::Status DecoderSpec::Add(const json& config, const std::string& file, bool* fused) {
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    for (const auto& sub : config.at("decoders")) RETURN_IF_ERROR(Add(sub, file, fused));
  } else if (type == "ByteLevel") {
    byte_level = true;
    *fused = true;  // the byte-level decoder joins all tokens into one string
  } else if (type == "ByteFallback") {
    byte_fallback = true;
  } else if (type == "Fuse") {
    *fused = true;
  } else if (type == "Replace") {
    const json& pattern = config.at("pattern");
    if (!pattern.contains("String")) return Unsupported(file, "decoder Replace pattern", "Regex");
    replacements.emplace_back(pattern["String"].get<std::string>(),
                              config.at("content").get<std::string>());
  } else if (type == "Strip") {
    const std::string content = config.at("content").get<std::string>();
    const int start = config.value("start", 0), stop = config.value("stop", 0);
    // Stripping each token separately, or the end of the text, would need look-ahead in the
    // streaming detokenizer; no supported file does either.
    if (content.size() != 1 || stop != 0 || (!*fused && start != 0)) {
      return Unsupported(file, "decoder", "Strip (other than leading, after Fuse)");
    }
    strip_leading += start;
    strip_char = content[0];
  } else if (type == "Metaspace") {
    replacements.emplace_back(config.value("replacement", std::string("\xE2\x96\x81")), " ");
    std::string scheme = config.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = config.value("add_prefix_space", true) ? "always" : "never";
    if (scheme != "never") {
      strip_leading += 1;
      strip_char = ' ';
    }
  } else {
    return Unsupported(file, "decoder", type);
  }
  return absl::OkStatus();
}

std::string DecoderSpec::TokenBytes(std::string_view token) const {
  if (byte_fallback && token.size() == 6 && token.starts_with("<0x") && token.ends_with(">")) {
    int value = 0;
    bool ok = true;
    for (char c : token.substr(3, 2)) {
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else {
        ok = false;
      }
    }
    if (ok) return std::string(1, static_cast<char>(value));
  }
  std::string text(token);
  for (const auto& [from, to] : replacements) {
    if (from.empty()) continue;
    std::string out;
    size_t last = 0;
    for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, last)) {
      out.append(text, last, pos - last);
      out.append(to);
      last = pos + from.size();
    }
    out.append(text, last);
    text = std::move(out);
  }
  if (!byte_level) return text;
  // A token whose characters are not all in the byte table is kept as it is, as in Hugging Face.
  std::string bytes;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const int b = UnicodeToByte(DecodeCodepoint(std::string_view(text).substr(i), &len));
    if (b < 0) return text;
    bytes.push_back(static_cast<char>(b));
    i += len;
  }
  return bytes;
}

}  // namespace specula::tokenizer_internal
