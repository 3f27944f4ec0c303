// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback and unk handling.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json_fwd.hpp"

namespace specula::tokenizer_internal {

class BpeModel {
 public:
  // Parses `model` (the "model" object of tokenizer.json). `file` names the source in errors.
  // Ids must be below `max_vocab_size`.
  static absl::StatusOr<BpeModel> FromJson(const nlohmann::json& model, const std::string& file,
                                           int64_t max_vocab_size);

  // Appends the ids of one pre-token (already in the vocabulary's alphabet, e.g. byte-level
  // characters or "▁"-prefixed text).
  void Tokenize(std::string_view word, std::vector<TokenId>* out) const;

  std::optional<TokenId> Find(std::string_view token) const;
  // Largest id + 1.
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }
  // Empty for ids without a vocabulary entry.
  const std::string& token(TokenId id) const { return id_to_token_[id]; }
  bool byte_fallback() const { return byte_fallback_; }
  // True when every input character becomes at least one id of its own: none is dropped (no unk
  // token, no byte fallback) and no run of them is fused into one unk. `byte_level`: the input is
  // in the GPT-2 byte alphabet (a ByteLevel pre-tokenizer ran).
  bool KeepsEveryCharacter(bool byte_level) const;

 private:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  static uint64_t PairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Initial symbols of `word`: one per character, byte-fallback/unk for unknown ones.
  void InitialSymbols(std::string_view word, std::vector<TokenId>* symbols) const;

  absl::flat_hash_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  TokenId byte_ids_[256];  // <0xNN> ids when byte_fallback_ (-1 where missing)
};

}  // namespace specula::tokenizer_internal
