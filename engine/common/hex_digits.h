// Hexadecimal digits, as escapes spell them (URL %XX, regex and grammar \xHH and \uHHHH).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace specula {

// The value of hexadecimal digit `c`; -1 when it is not one.
inline int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The value of the `digits` hexadecimal digits at text[*i], advancing *i past the digits read;
// nullopt when fewer than `digits` are there (*i then points at the first that is not one).
inline std::optional<uint32_t> ReadHexDigits(std::string_view text, size_t* i, int digits) {
  uint32_t v = 0;
  for (int k = 0; k < digits; ++k) {
    const int h = *i < text.size() ? HexDigitValue(text[*i]) : -1;
    if (h < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(h);
    ++*i;
  }
  return v;
}

}  // namespace specula
