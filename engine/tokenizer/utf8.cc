#include "engine/tokenizer/utf8.h"

#include <array>

namespace specula::tokenizer_internal {
namespace {

// Allowed range of the second byte for a lead byte; later continuation bytes are 80..BF.
// Returns the number of continuation bytes (0 for an invalid lead).
int SequenceShape(unsigned char lead, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 1;
  if (lead == 0xE0) {
    *lo = 0xA0;
    return 2;
  }
  if (lead == 0xED) {
    *hi = 0x9F;
    return 2;
  }
  if (lead >= 0xE1 && lead <= 0xEF) return 2;
  if (lead == 0xF0) {
    *lo = 0x90;
    return 3;
  }
  if (lead == 0xF4) {
    *hi = 0x8F;
    return 3;
  }
  if (lead >= 0xF1 && lead <= 0xF3) return 3;
  return 0;
}

// Examines the sequence at s[0]. Returns its length if complete and valid; otherwise sets
// *valid_prefix to the length of the maximal subpart (>= 1) and *truncated when the subpart is
// valid so far but ran into the end of `s`.
size_t ScanSequence(std::string_view s, size_t* valid_prefix, bool* truncated) {
  const auto lead = static_cast<unsigned char>(s[0]);
  *truncated = false;
  if (lead < 0x80) return 1;
  unsigned char lo, hi;
  const int cont = SequenceShape(lead, &lo, &hi);
  if (cont == 0) {
    *valid_prefix = 1;
    return 0;
  }
  for (int i = 1; i <= cont; ++i) {
    if (static_cast<size_t>(i) >= s.size()) {
      *valid_prefix = i;
      *truncated = true;
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      *valid_prefix = i;
      return 0;
    }
  }
  return cont + 1;
}

std::array<std::string, 256> BuildByteTable() {
  std::array<std::string, 256> table;
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : 256 + next++;
    AppendCodepoint(cp, &table[b]);
  }
  return table;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t prefix;
    bool truncated;
    const size_t n = ScanSequence(s.substr(i), &prefix, &truncated);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

uint32_t DecodeCodepoint(std::string_view s, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  *len = Utf8CharLen(b0);
  uint32_t cp;
  switch (*len) {
    case 1:
      return b0;
    case 2:
      cp = b0 & 0x1F;
      break;
    case 3:
      cp = b0 & 0x0F;
      break;
    default:
      cp = b0 & 0x07;
  }
  for (size_t i = 1; i < *len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  return cp;
}

void AppendCodepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t i = 0;
  while (i < in.size()) {
    size_t prefix;
    bool truncated;
    const size_t n = ScanSequence(in.substr(i), &prefix, &truncated);
    if (n > 0) {
      out->append(in.substr(i, n));
      i += n;
    } else if (truncated && !final) {
      break;  // may still complete with the next bytes
    } else {
      out->append(kReplacement);
      i += prefix;
    }
  }
  return i;
}

const std::string& ByteToUnicode(uint8_t b) {
  static const std::array<std::string, 256> table = BuildByteTable();
  return table[b];
}

int UnicodeToByte(uint32_t cp) {
  static const std::array<int, 512> reverse = [] {
    std::array<int, 512> r;
    r.fill(-1);
    for (int b = 0; b < 256; ++b) {
      size_t len;
      r[DecodeCodepoint(ByteToUnicode(b), &len)] = b;
    }
    return r;
  }();
  return cp < reverse.size() ? reverse[cp] : -1;
}

}  // namespace specula::tokenizer_internal
