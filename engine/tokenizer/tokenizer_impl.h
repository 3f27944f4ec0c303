// The concrete tokenizer.json implementation behind Tokenizer. Internal to engine/tokenizer/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/tokenizer.h"

namespace specula::tokenizer_internal {

struct AddedToken {
  TokenId id;
  std::string content;
  bool special;
  bool lstrip, rstrip, single_word;
};

class HfTokenizer final : public Tokenizer {
 public:
  // `file` names the tokenizer.json in error messages.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Create(std::string_view tokenizer_json,
                                                             std::string_view config_json,
                                                             const std::string& file,
                                                             const std::string& config_file,
                                                             int64_t max_vocab_size);

  using Tokenizer::Encode;
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override;
  std::optional<int64_t> max_bytes_per_token() const override { return max_bytes_per_token_; }
  absl::StatusOr<std::string> Decode(absl::Span<const TokenId> ids,
                                     bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(token_bytes_.size()); }
  std::optional<TokenId> TokenToId(std::string_view token) const override;
  std::string IdToToken(TokenId id) const override;
  bool IsSpecial(TokenId id) const override;
  std::optional<TokenId> bos_token_id() const override { return bos_id_; }
  std::optional<TokenId> eos_token_id() const override { return eos_id_; }
  const ChatTemplates& chat_templates() const override { return chat_templates_; }
  // Template files found beside the tokenizer replace tokenizer_config.json's templates.
  void ReplaceChatTemplates(ChatTemplates templates) { chat_templates_ = std::move(templates); }
  std::string TokenBytes(TokenId id) const override;

  // Leading characters the decoder strips from the start of the decoded text (SentencePiece's
  // prefix space); the streaming detokenizer applies the same rule.
  int strip_leading() const { return decoder_.strip_leading; }
  char strip_char() const { return decoder_.strip_char; }

 private:
  struct Segment {
    std::string_view text;  // when id < 0
    TokenId id;             // an added token
    bool at_start;          // text begins at offset 0 of the input
  };
  HfTokenizer() = default;
  absl::Status LoadTokenizerJson(std::string_view json_text, const std::string& file,
                                 int64_t max_vocab_size);
  std::optional<int64_t> ComputeMaxBytesPerToken() const;
  absl::Status LoadConfigJson(std::string_view json_text, const std::string& file);
  // With `split_special`, special added tokens are not matched (they stay text).
  void SplitAddedTokens(std::string_view text, const EncodeOptions& options,
                        std::vector<Segment>* out) const;
  absl::Status EncodeSegment(std::string_view text, bool at_start,
                             absl::flat_hash_map<std::string, std::vector<TokenId>>* cache,
                             int64_t max_tokens, std::vector<TokenId>* out) const;

  std::optional<BpeModel> model_;
  std::optional<Normalizer> normalizer_;
  std::optional<PreTokenizer> pre_tokenizer_;
  std::optional<PostProcessor> post_processor_;
  DecoderSpec decoder_;

  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, size_t> added_by_content_;
  absl::flat_hash_map<TokenId, size_t> added_by_id_;
  std::vector<size_t> added_by_first_byte_[256];  // indices into added_, longest first

  std::vector<std::string> token_bytes_;  // per id, after the decoder's per-token mapping
  std::vector<bool> special_;

  std::optional<TokenId> bos_id_, eos_id_;
  std::optional<bool> add_bos_, add_eos_;  // tokenizer_config.json, SentencePiece-style only
  ChatTemplates chat_templates_;
  // The BPE model turns every character of a pre-token into ids of its own (BpeModel::
  // KeepsEveryCharacter), and no vocabulary string is longer than longest_vocab_bytes_: a
  // pre-token of L bytes then yields at least L / longest_vocab_bytes_ ids.
  bool bpe_keeps_every_character_ = false;
  size_t longest_vocab_bytes_ = 4;
  std::optional<int64_t> max_bytes_per_token_;
};

}  // namespace specula::tokenizer_internal
