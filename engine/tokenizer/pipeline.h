// Normalizer, pre-tokenizer, post-processor and decoder stages of tokenizer.json, each parsed
// from its JSON object into a flat list of steps (nested "Sequence"s are flattened).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json_fwd.hpp"

namespace specula::tokenizer_internal {

// INVALID_ARGUMENT naming the file, the stage and a component type this tokenizer cannot run.
absl::Status Unsupported(const std::string& file, absl::string_view stage,
                         const std::string& type);
// OK when `id` is a valid id of a vocabulary of `vocab_size`; else INVALID_ARGUMENT naming the
// file and the token (`what` "token" or "added token", `content` its text). Checked before
// anything is sized by the largest id.
absl::Status CheckVocabularyId(const std::string& file, absl::string_view what,
                               absl::string_view content, int64_t id, int64_t vocab_size);
// The "type" string of a component object, or "" when absent.
std::string TypeOf(const nlohmann::json& config);

class Normalizer {
 public:
  // `config` may be null (no normalizer).
  static absl::StatusOr<Normalizer> FromJson(const nlohmann::json& config, const std::string& file);
  absl::Status Apply(std::string* text) const;
  // True when no step can make a text shorter: prepends, and replacements of a literal string by
  // one at least as long. (Unicode normalization can compose characters; a regex can match more
  // than it is replaced with.)
  bool NeverShrinks() const;

 private:
  struct Step {
    enum Kind { kPrepend, kReplace, kNfc, kNfd, kNfkc, kNfkd } kind;
    std::string text;                // Prepend: prefix; Replace: replacement
    std::shared_ptr<Regex> pattern;  // Replace
    std::optional<size_t> literal_size;  // Replace with a "String" pattern: its length
  };
  absl::Status Add(const nlohmann::json& config, const std::string& file);
  std::vector<Step> steps_;
};

// A piece of text on its way through the pre-tokenizer. `at_start`: the piece begins at offset 0
// of the input (Metaspace's prepend_scheme "first" only prefixes such a piece).
struct PreToken {
  std::string text;
  bool at_start;
};

class PreTokenizer {
 public:
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& config,
                                               const std::string& file);
  absl::Status Apply(std::vector<PreToken>* pieces) const;
  // True if a ByteLevel step maps the text to the GPT-2 byte alphabet.
  bool byte_level() const { return byte_level_; }
  // True when every input byte ends up in some piece (no Split removes its matches).
  bool KeepsEveryByte() const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    enum Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::shared_ptr<Regex> pattern;  // Split; ByteLevel with use_regex
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
    bool split = false;  // Metaspace
  };
  absl::Status Add(const nlohmann::json& config, const std::string& file);
  absl::Status Split(const Step& step, std::vector<PreToken>* pieces) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// TemplateProcessing (single sequence) and the id-neutral ByteLevel processor.
class PostProcessor {
 public:
  static absl::StatusOr<PostProcessor> FromJson(const nlohmann::json& config,
                                                const std::string& file);
  std::vector<TokenId> Apply(std::vector<TokenId> ids) const;
  // The first special id the single template puts before the sequence, if any (used as the bos
  // id when tokenizer_config.json does not name one).
  std::optional<TokenId> leading_special() const;

 private:
  struct Item {
    bool sequence;             // the input sequence ("A")
    std::vector<TokenId> ids;  // otherwise the special token's ids
  };
  // Each template in order; an empty list of templates leaves the ids unchanged.
  std::vector<std::vector<Item>> templates_;
};

// How ids turn back into bytes. Every decoder chain the supported files use reduces to: a
// per-token byte mapping, then concatenation, then stripping some leading characters.
struct DecoderSpec {
  bool byte_level = false;     // map characters through the GPT-2 byte table
  bool byte_fallback = false;  // "<0xNN>" tokens stand for byte NN
  std::vector<std::pair<std::string, std::string>> replacements;  // per token, in order
  int strip_leading = 0;  // leading `strip_char`s removed from the whole text
  char strip_char = ' ';

  static absl::StatusOr<DecoderSpec> FromJson(const nlohmann::json& config,
                                              const std::string& file);
  // Bytes of a vocabulary token (not an added token) after the per-token mapping.
  std::string TokenBytes(std::string_view token) const;

 private:
  absl::Status Add(const nlohmann::json& config, const std::string& file, bool* fused);
};

}  // namespace specula::tokenizer_internal
