#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/common/bounded_file.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace tokenizer_internal {
namespace {

using json = nlohmann::json;

// Pieces longer than this are not cached: they rarely repeat and would bloat the cache.
constexpr size_t kMaxCachedPiece = 256;

absl::StatusOr<json> ParseJson(std::string_view text, const std::string& file) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": top level is not a JSON object"));
  }
  return root;
}

const json& FieldOrNull(const json& obj, const char* key) {
  static const json kNull;
  const auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// bos_token/eos_token: a string, {"content": ...} (AddedToken form) or null.
std::optional<std::string> TokenName(const json& config, const char* key) {
  const json& v = FieldOrNull(config, key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return std::nullopt;
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool IsWordByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') ||
         u == '_';
}

// The largest tokenizer.json in use is ~35 MB (Gemma 3's); the limit only refuses what is not one.
constexpr int64_t kMaxTokenizerFileBytes = 256 << 20;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  return ReadBoundedFile(path.string(), kMaxTokenizerFileBytes, "tokenizer file");
}

absl::Status TooManyTokens(int64_t max_tokens) {
  return absl::OutOfRangeError(
      absl::StrCat("the text encodes to more than ", max_tokens, " tokens"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Create(std::string_view tokenizer_json,
                                                                 std::string_view config_json,
                                                                 const std::string& file,
                                                                 const std::string& config_file,
                                                                 int64_t max_vocab_size) {
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  // nlohmann throws on wrong field types; those exceptions stop at this boundary.
  try {
    RETURN_IF_ERROR(tok->LoadTokenizerJson(tokenizer_json, file, max_vocab_size));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": malformed: ", e.what()));
  }
  try {
    RETURN_IF_ERROR(tok->LoadConfigJson(config_json, config_file));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_file, ": malformed: ", e.what()));
  }
  return tok;
}

absl::Status HfTokenizer::LoadTokenizerJson(std::string_view json_text, const std::string& file,
                                            int64_t max_vocab_size) {
  ASSIGN_OR_RETURN(const json root, ParseJson(json_text, file));
  if (!root.contains("model")) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": missing \"model\""));
  }
  ASSIGN_OR_RETURN(model_, BpeModel::FromJson(root.at("model"), file, max_vocab_size));
  ASSIGN_OR_RETURN(normalizer_, Normalizer::FromJson(FieldOrNull(root, "normalizer"), file));
  ASSIGN_OR_RETURN(pre_tokenizer_,
                   PreTokenizer::FromJson(FieldOrNull(root, "pre_tokenizer"), file));
  ASSIGN_OR_RETURN(post_processor_,
                   PostProcessor::FromJson(FieldOrNull(root, "post_processor"), file));
  ASSIGN_OR_RETURN(decoder_, DecoderSpec::FromJson(FieldOrNull(root, "decoder"), file));

  int64_t size = model_->size();
  const json& added = FieldOrNull(root, "added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": \"added_tokens\" is not an array"));
  }
  for (const json& t : added.is_array() ? added : json::array()) {
    const std::string content = t.at("content").get<std::string>();
    const json& id_json = t.at("id");
    // Read as int64 and checked before the narrowing: 2^32 + 7 must not become 7.
    if (!id_json.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": added token \"", content, "\" has an id that is not an integer"));
    }
    const int64_t id = id_json.get<int64_t>();
    if (content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": added token with id ", id, " has no content"));
    }
    RETURN_IF_ERROR(CheckVocabularyId(file, "added token", content, id, max_vocab_size));
    AddedToken a{static_cast<TokenId>(id),  content,
                 t.value("special", false), t.value("lstrip", false),
                 t.value("rstrip", false),  t.value("single_word", false)};
    size = std::max<int64_t>(size, a.id + 1);
    if (const auto it = added_by_id_.find(a.id); it != added_by_id_.end()) {
      added_[it->second] = a;  // a repeated id: the later entry wins
      continue;
    }
    added_by_id_[a.id] = added_.size();
    added_.push_back(std::move(a));
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    added_by_content_[added_[i].content] = i;
    added_by_first_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
  }
  for (auto& list : added_by_first_byte_) {
    // Longest first: the longest added token matching at a position wins.
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });
  }

  token_bytes_.assign(size, std::string());
  special_.assign(size, false);
  for (TokenId id = 0; id < model_->size(); ++id) {
    if (!model_->token(id).empty()) token_bytes_[id] = decoder_.TokenBytes(model_->token(id));
  }
  for (const AddedToken& a : added_) {
    token_bytes_[a.id] = a.content;
    special_[a.id] = a.special;
  }
  bpe_keeps_every_character_ = model_->KeepsEveryCharacter(pre_tokenizer_->byte_level());
  // An unknown character (up to 4 bytes) becomes one unk id whatever the unk string's length.
  longest_vocab_bytes_ = 4;
  for (TokenId id = 0; id < model_->size(); ++id) {
    longest_vocab_bytes_ = std::max(longest_vocab_bytes_, model_->token(id).size());
  }
  max_bytes_per_token_ = ComputeMaxBytesPerToken();
  return absl::OkStatus();
}

std::optional<int64_t> HfTokenizer::ComputeMaxBytesPerToken() const {
  if (!normalizer_->NeverShrinks() || !pre_tokenizer_->KeepsEveryByte() ||
      !bpe_keeps_every_character_) {
    return std::nullopt;
  }
  size_t longest = longest_vocab_bytes_;
  for (const AddedToken& a : added_) {
    if (a.lstrip || a.rstrip) return std::nullopt;  // absorbs any run of spaces around it
    longest = std::max(longest, a.content.size());
  }
  // Normalizers and pre-tokenizers here only grow text (a byte becomes a byte-level character,
  // " " becomes "▁"), so a vocabulary string is at least as long as the input it stands for.
  return static_cast<int64_t>(longest);
}

absl::Status HfTokenizer::LoadConfigJson(std::string_view json_text, const std::string& file) {
  auto resolve = [&](const std::optional<std::string>& name,
                     const char* key) -> absl::StatusOr<std::optional<TokenId>> {
    if (!name) return std::nullopt;
    const auto id = TokenToId(*name);
    if (!id) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", key, " \"", *name, "\" is not in the vocabulary"));
    }
    return id;
  };
  bos_id_ = post_processor_->leading_special();
  if (json_text.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const json config, ParseJson(json_text, file));
  if (const auto name = TokenName(config, "bos_token")) {
    ASSIGN_OR_RETURN(bos_id_, resolve(name, "bos_token"));
  }
  ASSIGN_OR_RETURN(eos_id_, resolve(TokenName(config, "eos_token"), "eos_token"));
  // Like transformers' LlamaTokenizerFast, the config's add_bos/add_eos decide for
  // SentencePiece-style files; byte-level files follow their post_processor.
  if (!pre_tokenizer_->byte_level()) {
    if (const json& v = FieldOrNull(config, "add_bos_token"); v.is_boolean())
      add_bos_ = v.get<bool>();
    if (const json& v = FieldOrNull(config, "add_eos_token"); v.is_boolean())
      add_eos_ = v.get<bool>();
  }
  const json& tmpl = FieldOrNull(config, "chat_template");
  if (tmpl.is_string()) {
    chat_templates_.by_name["default"] = tmpl.get<std::string>();
  } else if (tmpl.is_array()) {
    // Named templates, as transformers reads them: {name: template}; the one used is picked
    // per request (ChatTemplates::Pick).
    for (const json& t : tmpl) {
      const json& name = FieldOrNull(t, "name");
      const json& text = FieldOrNull(t, "template");
      if (!name.is_string() || !text.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": chat_template: each entry needs a string name and template"));
      }
      chat_templates_.by_name[name.get<std::string>()] = text.get<std::string>();
    }
  }
  if (!chat_templates_.empty()) chat_templates_.origin = absl::StrCat(file, " chat_template");
  return absl::OkStatus();
}

void HfTokenizer::SplitAddedTokens(std::string_view text, const EncodeOptions& options,
                                   std::vector<Segment>* out) const {
  const auto& plain = options.plain_ranges;
  auto next_plain = plain.begin();  // the first range that does not end at or before i
  size_t seg_start = 0, i = 0;
  while (i < text.size()) {
    while (next_plain != plain.end() && next_plain->second <= i) ++next_plain;
    const AddedToken* found = nullptr;
    for (size_t idx : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = added_[idx];
      if (a.special && options.split_special_tokens) continue;
      // A special token overlapping a plain range is that range's text.
      if (a.special && next_plain != plain.end() && next_plain->first < i + a.content.size()) {
        continue;
      }
      if (!text.substr(i).starts_with(a.content)) continue;
      if (a.single_word &&
          ((i > 0 && IsWordByte(text[i - 1])) ||
           (i + a.content.size() < text.size() && IsWordByte(text[i + a.content.size()])))) {
        continue;
      }
      found = &a;
      break;
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t b = i, e = i + found->content.size();
    if (found->lstrip) {
      while (b > seg_start && IsAsciiSpace(text[b - 1])) --b;
    }
    if (found->rstrip) {
      while (e < text.size() && IsAsciiSpace(text[e])) ++e;
    }
    if (b > seg_start) out->push_back({text.substr(seg_start, b - seg_start), -1, seg_start == 0});
    out->push_back({{}, found->id, false});
    seg_start = i = e;
  }
  if (seg_start < text.size()) out->push_back({text.substr(seg_start), -1, seg_start == 0});
}

absl::Status HfTokenizer::EncodeSegment(
    std::string_view text, bool at_start,
    absl::flat_hash_map<std::string, std::vector<TokenId>>* cache, int64_t max_tokens,
    std::vector<TokenId>* out) const {
  std::vector<PreToken> pieces{{std::string(text), at_start}};
  RETURN_IF_ERROR(normalizer_->Apply(&pieces[0].text));
  RETURN_IF_ERROR(pre_tokenizer_->Apply(&pieces));
  for (const PreToken& p : pieces) {
    // A piece of L bytes (in the vocabulary's alphabet now) becomes at least L / longest ids,
    // so one huge piece (a run of letters without a space) is refused before its BPE runs.
    const int64_t at_least =
        bpe_keeps_every_character_ ? static_cast<int64_t>(p.text.size() / longest_vocab_bytes_) : 0;
    if (static_cast<int64_t>(out->size()) + at_least > max_tokens) return TooManyTokens(max_tokens);
    if (p.text.empty()) continue;
    if (p.text.size() > kMaxCachedPiece) {
      model_->Tokenize(p.text, out);
      continue;
    }
    auto [it, inserted] = cache->try_emplace(p.text);
    if (inserted) model_->Tokenize(p.text, &it->second);
    out->insert(out->end(), it->second.begin(), it->second.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenId>> HfTokenizer::Encode(std::string_view text,
                                                         const EncodeOptions& options) const {
  const int64_t max_tokens = options.max_tokens;
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("Encode: input is not valid UTF-8 (byte offset ", bad, ")"));
  }
  std::vector<Segment> segments;
  SplitAddedTokens(text, options, &segments);
  absl::flat_hash_map<std::string, std::vector<TokenId>> cache;
  std::vector<TokenId> ids;
  ids.reserve(std::min<int64_t>(text.size() / 3, max_tokens) + 4);
  for (const Segment& seg : segments) {
    if (static_cast<int64_t>(ids.size()) > max_tokens) return TooManyTokens(max_tokens);
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      RETURN_IF_ERROR(EncodeSegment(seg.text, seg.at_start, &cache, max_tokens, &ids));
    }
  }
  // With single_bos, a text that already starts with the BOS token gets no second one.
  const bool starts_with_bos =
      options.single_bos && bos_id_.has_value() && !ids.empty() && ids.front() == *bos_id_;
  std::vector<TokenId> out;
  if (!options.add_special_tokens) {
    out = std::move(ids);
  } else if (add_bos_ || add_eos_) {
    out.reserve(ids.size() + 2);
    if (add_bos_.value_or(false) && bos_id_ && !starts_with_bos) out.push_back(*bos_id_);
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_eos_.value_or(false) && eos_id_) out.push_back(*eos_id_);
  } else {
    const bool adds_bos = bos_id_.has_value() && post_processor_->leading_special() == bos_id_;
    out = post_processor_->Apply(std::move(ids));
    if (adds_bos && starts_with_bos) out.erase(out.begin());
  }
  if (static_cast<int64_t>(out.size()) > max_tokens) return TooManyTokens(max_tokens);
  return out;
}

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const TokenId> ids,
                                                bool skip_special_tokens) const {
  std::string raw;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Decode: token id ", id, " is out of range [0, ", vocab_size(), ")"));
    }
    if (skip_special_tokens && special_[id]) continue;
    raw += token_bytes_[id];
  }
  size_t start = 0;
  while (start < static_cast<size_t>(decoder_.strip_leading) && start < raw.size() &&
         raw[start] == decoder_.strip_char) {
    ++start;
  }
  std::string text;
  text.reserve(raw.size() - start);
  AppendUtf8Lossy(std::string_view(raw).substr(start), /*final=*/true, &text);
  return text;
}

std::optional<TokenId> HfTokenizer::TokenToId(std::string_view token) const {
  if (const auto it = added_by_content_.find(AsAbsl(token)); it != added_by_content_.end()) {
    return added_[it->second].id;
  }
  return model_->Find(token);
}

std::string HfTokenizer::IdToToken(TokenId id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return added_[it->second].content;
  }
  if (id < 0 || id >= model_->size()) return "";
  return model_->token(id);
}

bool HfTokenizer::IsSpecial(TokenId id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::string HfTokenizer::TokenBytes(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return token_bytes_[id];
}

}  // namespace tokenizer_internal

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir,
                                                                    int64_t max_vocab_size) {
  const std::filesystem::path root(dir);
  const std::filesystem::path tok_path = root / "tokenizer.json";
  const std::filesystem::path cfg_path = root / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(tok_path, ec)) {
    return absl::NotFoundError(absl::StrCat(tok_path.string(), " not found"));
  }
  ASSIGN_OR_RETURN(const std::string tok_json, tokenizer_internal::ReadFile(tok_path));
  std::string cfg_json;
  if (std::filesystem::exists(cfg_path, ec)) {
    ASSIGN_OR_RETURN(cfg_json, tokenizer_internal::ReadFile(cfg_path));
  }
  ASSIGN_OR_RETURN(auto tok,
                   tokenizer_internal::HfTokenizer::Create(tok_json, cfg_json, tok_path.string(),
                                                           cfg_path.string(), max_vocab_size));
  ASSIGN_OR_RETURN(ChatTemplates files, ReadChatTemplateFiles(root));
  if (!files.empty()) tok->ReplaceChatTemplates(std::move(files));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               int64_t max_vocab_size) {
  ASSIGN_OR_RETURN(auto tok, tokenizer_internal::HfTokenizer::Create(
                                 tokenizer_json, config_json, "tokenizer.json",
                                 "tokenizer_config.json", max_vocab_size));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace specula
