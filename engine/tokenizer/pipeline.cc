#include "engine/tokenizer/pipeline.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specula::tokenizer_internal {
namespace {

using json = nlohmann::json;

// The GPT-2 pre-tokenization pattern ByteLevel uses with use_regex.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";


// {"String": "..."} or {"Regex": "..."} as used by Split and Replace.
absl::StatusOr<std::shared_ptr<Regex>> CompilePattern(const json& pattern,
                                                      const std::string& file) {
  if (pattern.contains("String")) {
    ASSIGN_OR_RETURN(auto re, Regex::Compile(pattern["String"].get<std::string>(), true));
    return std::shared_ptr<Regex>(std::move(re));
  }
  if (pattern.contains("Regex")) {
    auto re = Regex::Compile(pattern["Regex"].get<std::string>(), false);
    if (!re.ok())
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", re.status().message()));
    return std::shared_ptr<Regex>(std::move(*re));
  }
  return absl::InvalidArgumentError(absl::StrCat(file, ": pattern is neither String nor Regex"));
}

absl::Status Normalize(const icu::Normalizer2* (*get)(UErrorCode&), std::string* text) {
  bool ascii = true;
  for (char c : *text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return absl::OkStatus();  // ASCII is invariant under every normalization form
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = get(err);
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  if (U_SUCCESS(err)) norm->normalizeUTF8(0, *text, sink, nullptr, err);
  if (U_FAILURE(err)) {
    return absl::InternalError(absl::StrCat("ICU normalization failed: ", u_errorName(err)));
  }
  *text = std::move(out);
  return absl::OkStatus();
}

void ReplaceAll(const Regex& re, std::string_view with, std::string* text) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (!re.FindAll(*text, &matches).ok() || matches.empty()) return;
  std::string out;
  size_t last = 0;
  for (auto [b, e] : matches) {
    out.append(*text, last, b - last);
    out.append(with);
    last = e;
  }
  out.append(*text, last);
  *text = std::move(out);
}

}  // namespace

absl::Status CheckVocabularyId(const std::string& file, absl::string_view what,
                               absl::string_view content, int64_t id, int64_t vocab_size) {
  if (id >= 0 && id < vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what, " \"", content, "\" has id ", id,
                                                 ", outside the vocabulary [0, ", vocab_size, ")"));
}

absl::Status Unsupported(const std::string& file, absl::string_view stage,
                         const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": unsupported ", stage, " type \"", type, "\""));
}

std::string TypeOf(const nlohmann::json& config) {
  auto it = config.find("type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

// ---------------------------------------------------------------------------------------------
// Normalizer

absl::StatusOr<Normalizer> Normalizer::FromJson(const json& config, const std::string& file) {
  Normalizer n;
  if (!config.is_null()) RETURN_IF_ERROR(n.Add(config, file));
  return n;
}

absl::Status Normalizer::Add(const json& config, const std::string& file) {
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    for (const auto& sub : config.at("normalizers")) RETURN_IF_ERROR(Add(sub, file));
  } else if (type == "Prepend") {
    steps_.push_back(
        {Step::kPrepend, config.at("prepend").get<std::string>(), nullptr, std::nullopt});
  } else if (type == "Replace") {
    ASSIGN_OR_RETURN(auto re, CompilePattern(config.at("pattern"), file));
    std::optional<size_t> literal_size;
    if (const json& p = config.at("pattern"); p.is_object() && p.contains("String")) {
      literal_size = p.at("String").get<std::string>().size();
    }
    steps_.push_back(
        {Step::kReplace, config.at("content").get<std::string>(), std::move(re), literal_size});
  } else if (type == "NFC") {
    steps_.push_back({Step::kNfc, "", nullptr, std::nullopt});
  } else if (type == "NFD") {
    steps_.push_back({Step::kNfd, "", nullptr, std::nullopt});
  } else if (type == "NFKC") {
    steps_.push_back({Step::kNfkc, "", nullptr, std::nullopt});
  } else if (type == "NFKD") {
    steps_.push_back({Step::kNfkd, "", nullptr, std::nullopt});
  } else {
    return Unsupported(file, "normalizer", type);
  }
  return absl::OkStatus();
}

bool Normalizer::NeverShrinks() const {
  for (const Step& step : steps_) {
    if (step.kind == Step::kPrepend) continue;
    if (step.kind == Step::kReplace && step.literal_size.has_value() &&
        step.text.size() >= *step.literal_size) {
      continue;
    }
    return false;
  }
  return true;
}

absl::Status Normalizer::Apply(std::string* text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::kPrepend:
        if (!text->empty()) text->insert(0, step.text);
        break;
      case Step::kReplace:
        ReplaceAll(*step.pattern, step.text, text);
        break;
      case Step::kNfc:
        RETURN_IF_ERROR(Normalize(&icu::Normalizer2::getNFCInstance, text));
        break;
      case Step::kNfd:
        RETURN_IF_ERROR(Normalize(&icu::Normalizer2::getNFDInstance, text));
        break;
      case Step::kNfkc:
        RETURN_IF_ERROR(Normalize(&icu::Normalizer2::getNFKCInstance, text));
        break;
      case Step::kNfkd:
        RETURN_IF_ERROR(Normalize(&icu::Normalizer2::getNFKDInstance, text));
        break;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// PreTokenizer

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const json& config, const std::string& file) {
  PreTokenizer p;
  if (!config.is_null()) RETURN_IF_ERROR(p.Add(config, file));
  return p;
}

absl::Status PreTokenizer::Add(const json& config, const std::string& file) {
  const std::string type = TypeOf(config);
  Step step;
  if (type == "Sequence") {
    for (const auto& sub : config.at("pretokenizers")) RETURN_IF_ERROR(Add(sub, file));
    return absl::OkStatus();
  } else if (type == "Split") {
    step.kind = Step::kSplit;
    ASSIGN_OR_RETURN(step.pattern, CompilePattern(config.at("pattern"), file));
    step.invert = config.value("invert", false);
    const std::string behavior = config.at("behavior").get<std::string>();
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      return Unsupported(file, "Split behavior", behavior);
    }
  } else if (type == "ByteLevel") {
    step.kind = Step::kByteLevel;
    step.add_prefix_space = config.value("add_prefix_space", true);
    if (config.value("use_regex", true)) {
      ASSIGN_OR_RETURN(auto re, Regex::Compile(kGpt2Pattern, false));
      step.pattern = std::move(re);
    }
    byte_level_ = true;
  } else if (type == "Metaspace") {
    step.kind = Step::kMetaspace;
    step.replacement = config.value("replacement", std::string("\xE2\x96\x81"));
    step.split = config.value("split", true);
    std::string scheme = config.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = config.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") {
      step.prepend = Step::kAlways;
    } else if (scheme == "first") {
      step.prepend = Step::kFirst;
    } else if (scheme == "never") {
      step.prepend = Step::kNever;
    } else {
      return Unsupported(file, "Metaspace prepend_scheme", scheme);
    }
  } else {
    return Unsupported(file, "pre_tokenizer", type);
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status PreTokenizer::Split(const Step& step, std::vector<PreToken>* pieces) const {
  std::vector<PreToken> out;
  std::vector<std::pair<size_t, size_t>> matches;
  struct Span {
    size_t b, e;
    bool match;
  };
  std::vector<Span> spans;
  for (PreToken& piece : *pieces) {
    RETURN_IF_ERROR(step.pattern->FindAll(piece.text, &matches));
    spans.clear();
    size_t last = 0;
    for (auto [b, e] : matches) {
      if (b > last) spans.push_back({last, b, step.invert});
      spans.push_back({b, e, !step.invert});
      last = e;
    }
    if (last < piece.text.size()) spans.push_back({last, piece.text.size(), step.invert});
    // Merge spans according to the behaviour, then emit the non-empty ones.
    std::vector<std::pair<size_t, size_t>> parts;
    for (size_t i = 0; i < spans.size(); ++i) {
      const Span& s = spans[i];
      switch (step.behavior) {
        case Behavior::kRemoved:
          if (!s.match) parts.emplace_back(s.b, s.e);
          break;
        case Behavior::kIsolated:
          parts.emplace_back(s.b, s.e);
          break;
        case Behavior::kMergedWithPrevious:
          // A delimiter joins the piece before it unless that piece is a delimiter too.
          if (s.match && i > 0 && !spans[i - 1].match) {
            parts.back().second = s.e;
          } else {
            parts.emplace_back(s.b, s.e);
          }
          break;
        case Behavior::kMergedWithNext:
          if (s.match && i + 1 < spans.size() && !spans[i + 1].match) {
            parts.emplace_back(s.b, spans[i + 1].e);
            ++i;
          } else {
            parts.emplace_back(s.b, s.e);
          }
          break;
        case Behavior::kContiguous:
          if (s.match && i > 0 && spans[i - 1].match) {
            parts.back().second = s.e;
          } else {
            parts.emplace_back(s.b, s.e);
          }
          break;
      }
    }
    for (auto [b, e] : parts) {
      if (e > b) out.push_back({piece.text.substr(b, e - b), piece.at_start && b == 0});
    }
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

bool PreTokenizer::KeepsEveryByte() const {
  for (const Step& step : steps_) {
    if (step.kind == Step::kSplit && step.behavior == Behavior::kRemoved) return false;
    if (step.kind == Step::kMetaspace && step.replacement.empty()) return false;
  }
  return true;
}

absl::Status PreTokenizer::Apply(std::vector<PreToken>* pieces) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::kSplit:
        RETURN_IF_ERROR(Split(step, pieces));
        break;
      case Step::kByteLevel: {
        if (step.add_prefix_space) {
          for (PreToken& p : *pieces) {
            if (!p.text.empty() && p.text[0] != ' ') p.text.insert(0, " ");
          }
        }
        if (step.pattern) {
          Step isolate;
          isolate.kind = Step::kSplit;
          isolate.pattern = step.pattern;
          RETURN_IF_ERROR(Split(isolate, pieces));
        }
        for (PreToken& p : *pieces) {
          std::string mapped;
          mapped.reserve(p.text.size() * 2);
          for (char c : p.text) mapped += ByteToUnicode(static_cast<uint8_t>(c));
          p.text = std::move(mapped);
        }
        break;
      }
      case Step::kMetaspace: {
        for (PreToken& p : *pieces) {
          absl::StrReplaceAll({{" ", step.replacement}}, &p.text);
          const bool prepend =
              step.prepend == Step::kAlways || (step.prepend == Step::kFirst && p.at_start);
          if (prepend && !p.text.empty() && !p.text.starts_with(step.replacement)) {
            p.text.insert(0, step.replacement);
          }
        }
        if (step.split) {
          // Each replacement starts a new piece (MergedWithNext on the replacement string).
          std::vector<PreToken> out;
          for (PreToken& p : *pieces) {
            size_t begin = 0;
            for (size_t pos = p.text.find(step.replacement, 1); pos != std::string::npos;
                 pos = p.text.find(step.replacement, pos + 1)) {
              if (pos > begin) {
                out.push_back({p.text.substr(begin, pos - begin), p.at_start && begin == 0});
              }
              begin = pos;
            }
            out.push_back({p.text.substr(begin), p.at_start && begin == 0});
          }
          *pieces = std::move(out);
        }
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace specula::tokenizer_internal
