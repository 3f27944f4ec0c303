// Hugging Face `tokenizer.json` BPE tokenizer (byte-level and SentencePiece-style with byte
// fallback) plus the bits of `tokenizer_config.json` that change encoding (bos/eos, add_bos_token).
//
// Immutable after loading; Encode/Decode are const and safe from any number of threads.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer/chat_templates.h"

namespace specula {

using TokenId = int32_t;

struct EncodeOptions {
  // Let the post-processor (or tokenizer_config's add_bos/add_eos) add BOS and the like.
  bool add_special_tokens = true;
  // Special-token text in the input ("<|eot_id|>") is tokenized as ordinary text instead of
  // becoming the control token (Hugging Face's split_special_tokens): for text that comes from
  // users or tools, which must not be able to inject control tokens. Non-special added tokens
  // are still matched.
  bool split_special_tokens = false;
  // Byte ranges [begin, end) of the text, sorted and disjoint, where special tokens are not
  // recognised either (a special token whose text overlaps one is tokenized as ordinary text):
  // the message content inside a rendered chat prompt, while the template's own control tokens
  // around it stay control tokens.
  std::vector<std::pair<size_t, size_t>> plain_ranges;
  // With add_special_tokens: add no BOS to a text whose first token already is the BOS.
  // transformers adds it anyway (two BOS tokens, which is never what a prompt means); the server
  // and the CLI set this, the default keeps Hugging Face's behaviour.
  bool single_bos = false;
  // Encoding stops as soon as the ids number more than this: OUT_OF_RANGE, so an input far
  // past a context costs little more than the context may hold.
  int64_t max_tokens = std::numeric_limits<int64_t>::max();
};

class Tokenizer {
 public:
  // The largest vocabulary a tokenizer may have when no model bounds it (the biggest real ones
  // have about 256K ids).
  static constexpr int64_t kMaxVocabSize = int64_t{1} << 22;

  // Loads `dir/tokenizer.json` and, if present, `dir/tokenizer_config.json`. An id at or beyond
  // `max_vocab_size` (the model's vocabulary) is INVALID_ARGUMENT naming the file and the token.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(
      const std::string& dir, int64_t max_vocab_size = kMaxVocabSize);
  // `config_json` may be empty (no tokenizer_config.json).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view config_json,
      int64_t max_vocab_size = kMaxVocabSize);
  virtual ~Tokenizer() = default;

  // Splits added/special tokens out first, then normalizes, pre-tokenizes and runs BPE on the
  // rest. With `add_special_tokens`, applies the post-processor (e.g. Llama 3 prepends
  // <|begin_of_text|>) or, for SentencePiece-style files, the config's add_bos/add_eos.
  // Invalid UTF-8 input is INVALID_ARGUMENT; more than options.max_tokens ids OUT_OF_RANGE.
  virtual absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                                      const EncodeOptions& options) const = 0;
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text,
                                              bool add_special_tokens) const {
    EncodeOptions options;
    options.add_special_tokens = add_special_tokens;
    return Encode(text, options);
  }

  // An upper bound of the input bytes one id of Encode stands for, where the pipeline makes one
  // certain: every input byte survives normalization and pre-tokenization, no added token strips
  // the whitespace around it, unknown characters are not fused. Then an input of B bytes encodes
  // to at least ceil(B / bound) ids and can be refused by its size alone. nullopt otherwise.
  virtual std::optional<int64_t> max_bytes_per_token() const = 0;
  // Ids outside [0, vocab_size()) are INVALID_ARGUMENT naming the id. Byte-level pieces that do
  // not form valid UTF-8 come out as U+FFFD, as in Hugging Face.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const TokenId> ids,
                                             bool skip_special_tokens) const = 0;

  // Number of ids (base vocabulary plus added tokens; the largest id + 1).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<TokenId> TokenToId(std::string_view token) const = 0;
  // The raw vocabulary string of `id` (e.g. "Ġhello"); empty for an unknown id.
  virtual std::string IdToToken(TokenId id) const = 0;
  virtual bool IsSpecial(TokenId id) const = 0;
  virtual std::optional<TokenId> bos_token_id() const = 0;
  // From tokenizer_config.json's eos_token.
  virtual std::optional<TokenId> eos_token_id() const = 0;
  // The model's chat templates (engine/tokenizer/chat_templates.h): the template files of the
  // directory if it has any, else tokenizer_config.json's `chat_template`.
  virtual const ChatTemplates& chat_templates() const = 0;
  // The default template, or empty.
  const std::string& chat_template() const {
    static const std::string kNone;
    const std::string* t = chat_templates().Pick(/*with_tools=*/false);
    return t != nullptr ? *t : kNone;
  }

  // The raw bytes a single token stands for after decoding (byte-level: the bytes; SentencePiece:
  // "▁" → space, <0xNN> → the byte). Used by the streaming detokenizer and stop-string matching.
  virtual std::string TokenBytes(TokenId id) const = 0;
};

// Turns a stream of ids into a stream of text that never splits a UTF-8 sequence: bytes of an
// incomplete character are held back until the character completes. Also applies the decoder's
// position-dependent rules (SentencePiece's leading-space strip of the first token), so that the
// concatenation of all Push() outputs plus Finish() equals Decode(all ids).
// One instance per sequence; not thread-safe.
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Text that became complete with this token (possibly empty).
  std::string Push(TokenId id);
  // Whatever is still held back, with invalid trailing bytes replaced by U+FFFD.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  int strip_left_ = 0;  // leading strip_char_s the decoder still removes from the text
  char strip_char_ = ' ';
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace specula
