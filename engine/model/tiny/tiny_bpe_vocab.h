// A small byte-level BPE vocabulary learned deterministically from embedded English prose, so
// the tiny test models have a real (if small) GPT-2-style tokenizer without downloading one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

struct TinyBpeVocab {
  // Id -> token in the byte-level alphabet (GPT-2 byte-to-unicode, UTF-8 encoded): the 256 byte
  // tokens first, then merged tokens, then `special_tokens` (so their ids are the last ones).
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // in priority order
  std::vector<std::string> special_tokens;
  int64_t SpecialId(const std::string& content) const;  // -1 when absent
};

// The UTF-8 encoding of the character GPT-2's bytes_to_unicode assigns to byte `b`.
std::string ByteToUnicode(uint8_t b);

// Learns merges until the vocabulary (bytes + merges + specials) has exactly `vocab_size` ids.
// Deterministic: ties between equally frequent pairs go to the lexicographically smallest pair.
absl::StatusOr<TinyBpeVocab> BuildTinyBpeVocab(const std::vector<std::string>& special_tokens,
                                               int64_t vocab_size);

// The embedded training text (also handy as a tokenizer test corpus).
const std::string& TinyCorpus();

}  // namespace specula
