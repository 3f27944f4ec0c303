// UTF-8 helpers shared by the tokenizer, its decoder and the streaming detokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace specula::tokenizer_internal {

// Debian's Abseil is built with its own string_view type, distinct from std::string_view.
inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos when `s` is valid.
size_t FindInvalidUtf8(std::string_view s);

// Length of the UTF-8 character starting at s[0] (s must be valid UTF-8 and non-empty).
inline size_t Utf8CharLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Decodes the character at s[0] of valid UTF-8.
uint32_t DecodeCodepoint(std::string_view s, size_t* len);
void AppendCodepoint(uint32_t cp, std::string* out);

// Appends `in` to `out` with every maximal ill-formed subsequence replaced by U+FFFD (the
// Unicode/WHATWG "maximal subpart" rule, which Rust's from_utf8_lossy also follows). With
// `final` false an incomplete but so-far-valid sequence at the end is left unconsumed, so feeding
// a byte stream chunk by chunk gives exactly the same text as converting it in one go.
// Returns the number of bytes of `in` consumed.
size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out);

// GPT-2's reversible byte <-> printable-unicode mapping used by ByteLevel pre-tokenizers and
// decoders. ByteToUnicode(b) is the UTF-8 of the character standing for byte b.
const std::string& ByteToUnicode(uint8_t b);
// The byte a code point stands for, or -1 if it is not in the table.
int UnicodeToByte(uint32_t cp);

}  // namespace specula::tokenizer_internal
