// Which tokens of a vocabulary a GrammarMatcher allows next: the mask applied to a step's logits
// before sampling.
//
// A token is allowed when the grammar takes all of its bytes from the matcher's state. The
// vocabulary is kept sorted by bytes, so neighbours share prefixes: the walk keeps the state
// after each byte of the previous token and restarts from the longest common prefix, and a
// rejected prefix skips every token that starts with it (a depth-first walk of the vocabulary's
// trie without building the trie).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/grammar/matcher.h"

namespace specula::grammar {

class TokenTable {
 public:
  // `token_bytes[id]` is what token `id` decodes to; an empty string marks a token no grammar
  // allows (special and control tokens: their text is not output).
  explicit TokenTable(const std::vector<std::string>& token_bytes);

  int64_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return static_cast<size_t>((vocab_size_ + 31) / 32); }

 private:
  friend class TokenMasker;
  int64_t vocab_size_ = 0;
  std::vector<int32_t> ids_;       // tokens with bytes, sorted by their bytes
  std::vector<uint32_t> offsets_;  // ids_[i]'s bytes are bytes_[offsets_[i], offsets_[i + 1])
  std::string bytes_;
  std::vector<uint32_t> common_;  // common prefix length of sorted tokens i - 1 and i
  size_t max_length_ = 0;
};

// Computes masks; holds the walk's scratch states, so one per thread.
class TokenMasker {
 public:
  explicit TokenMasker(const TokenTable& table);
  // Sets bit `id % 32` of word `id / 32` of `allowed` for every token `matcher` takes whole,
  // and clears the others. Returns how many are allowed.
  int64_t Compute(const GrammarMatcher& matcher, std::vector<uint32_t>* allowed);

 private:
  const TokenTable& table_;
  std::vector<StackSet> states_;  // states_[d]: after the first d bytes of the current token
};

inline bool MaskAllows(const std::vector<uint32_t>& mask, int64_t id) {
  return (mask[static_cast<size_t>(id >> 5)] >> (id & 31)) & 1;
}

}  // namespace specula::grammar
