// Sets of Unicode code points, and their UTF-8 encodings as sequences of byte ranges: what a
// regular expression's character classes become in a grammar over bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Code points as sorted, disjoint, non-adjacent closed ranges.
class CodePointSet {
 public:
  CodePointSet() = default;
  static CodePointSet Of(uint32_t lo, uint32_t hi);
  // Every scalar value: all code points but the surrogates, which UTF-8 cannot encode.
  static CodePointSet All();

  void Add(uint32_t lo, uint32_t hi);
  void Add(const CodePointSet& other);
  CodePointSet Complement() const;  // within All()
  CodePointSet Minus(const CodePointSet& other) const;
  CodePointSet Intersect(const CodePointSet& other) const;
  bool Contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }
  bool operator==(const CodePointSet& other) const { return ranges_ == other.ranges_; }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// One UTF-8 byte per element: the byte's range [first, second].
using Utf8Sequence = std::vector<std::pair<uint8_t, uint8_t>>;

// The byte-range sequences whose concatenated matches are exactly the UTF-8 encodings of the
// scalar values in [lo, hi] (surrogates left out): at most a few dozen for any range.
std::vector<Utf8Sequence> Utf8Sequences(uint32_t lo, uint32_t hi);

// The UTF-8 encoding of scalar value `c`.
std::string EncodeUtf8(uint32_t c);
// The scalar value whose UTF-8 encoding starts at text[*i], advancing *i past it; nullopt (and
// *i unchanged) for invalid UTF-8: truncated, overlong, a surrogate, past U+10FFFF.
std::optional<uint32_t> DecodeUtf8(std::string_view text, size_t* i);

}  // namespace specula::grammar
