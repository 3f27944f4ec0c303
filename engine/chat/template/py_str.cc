#include "engine/chat/template/py_str.h"

#include <unicode/ucasemap.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/chat/template/error.h"
#include "engine/tokenizer/utf8.h"

namespace specula::jinja::py {
namespace {

using tokenizer_internal::DecodeCodepoint;
using tokenizer_internal::Utf8CharLen;

bool IsAscii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// One code point at a time: Next() returns it and advances.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  size_t pos() const { return pos_; }
  uint32_t Next() {
    size_t len = 1;
    const uint32_t cp = DecodeCodepoint(s_.substr(pos_), &len);
    pos_ += len;
    return cp;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

// Full Unicode case mapping of a UTF-8 string in the root locale, as CPython does.
std::string IcuCaseMap(std::string_view s, bool upper) {
  UErrorCode err = U_ZERO_ERROR;
  UCaseMap* map = ucasemap_open("", 0, &err);
  std::string out(s.size() * 3 + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    err = U_ZERO_ERROR;
    auto fn = upper ? ucasemap_utf8ToUpper : ucasemap_utf8ToLower;
    const int32_t n = fn(map, out.data(), static_cast<int32_t>(out.size()), s.data(),
                         static_cast<int32_t>(s.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(n, '\0');
      continue;
    }
    out.resize(U_SUCCESS(err) ? n : 0);
    break;
  }
  ucasemap_close(map);
  return out;
}

std::string MapEach(std::string_view s, uint32_t (*fn)(uint32_t cp, bool* state)) {
  std::string out;
  out.reserve(s.size());
  bool state = false;
  for (Cursor c(s); !c.done();) AppendCodepoint(fn(c.Next(), &state), &out);
  return out;
}

bool IsCased(uint32_t cp) { return u_hasBinaryProperty(cp, UCHAR_CASED); }

bool IsLineBreak(uint32_t cp) {
  switch (cp) {
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

// Adjusts Python's start/end arguments of find()/count() to [0, n].
int64_t AdjustBound(std::optional<int64_t> v, int64_t n, int64_t dflt) {
  if (!v) return dflt;
  int64_t x = *v;
  if (x < 0) x = std::max<int64_t>(0, x + n);
  return std::min(x, n);
}

}  // namespace

// ---- code points

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (Cursor c(s); !c.done();) out.push_back(c.Next());
  return out;
}

std::string Encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendCodepoint(cp, &out);
  return out;
}

void AppendCodepoint(uint32_t cp, std::string* out) {
  tokenizer_internal::AppendCodepoint(cp, out);
}

int64_t Length(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

int64_t CodepointIndex(std::string_view s, size_t byte) { return Length(s.substr(0, byte)); }

// ---- character classes

bool IsSpace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
bool IsAlpha(uint32_t cp) { return u_isalpha(cp); }
bool IsDecimal(uint32_t cp) { return u_charType(cp) == U_DECIMAL_DIGIT_NUMBER; }
bool IsDigit(uint32_t cp) {
  const int t = u_getIntPropertyValue(cp, UCHAR_NUMERIC_TYPE);
  return t == U_NT_DECIMAL || t == U_NT_DIGIT;
}
bool IsNumeric(uint32_t cp) { return u_getIntPropertyValue(cp, UCHAR_NUMERIC_TYPE) != U_NT_NONE; }
bool IsAlnum(uint32_t cp) { return IsAlpha(cp) || IsNumeric(cp); }
bool IsWordChar(uint32_t cp) { return cp == '_' || IsAlnum(cp); }
bool IsUpper(uint32_t cp) { return u_hasBinaryProperty(cp, UCHAR_UPPERCASE); }
bool IsLower(uint32_t cp) { return u_hasBinaryProperty(cp, UCHAR_LOWERCASE); }
bool IsTitle(uint32_t cp) { return u_charType(cp) == U_TITLECASE_LETTER; }
bool IsPrintable(uint32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(cp)) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

// ---- case

std::string Upper(std::string_view s) {
  if (!IsAscii(s)) return IcuCaseMap(s, /*upper=*/true);
  std::string out(s);
  for (char& c : out) c = (c >= 'a' && c <= 'z') ? c - 32 : c;
  return out;
}

std::string Lower(std::string_view s) {
  if (!IsAscii(s)) return IcuCaseMap(s, /*upper=*/false);
  std::string out(s);
  for (char& c : out) c = (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return out;
}

std::string Title(std::string_view s) {
  return MapEach(s, [](uint32_t cp, bool* prev_cased) -> uint32_t {
    const uint32_t mapped = *prev_cased ? u_tolower(cp) : u_totitle(cp);
    *prev_cased = IsCased(cp);
    return mapped;
  });
}

std::string Capitalize(std::string_view s) {
  if (s.empty()) return "";
  const size_t first = Utf8CharLen(static_cast<unsigned char>(s[0]));
  std::string out;
  AppendCodepoint(u_totitle(Decode(s.substr(0, first))[0]), &out);
  return out + Lower(s.substr(first));
}

std::string SwapCase(std::string_view s) {
  return MapEach(s, [](uint32_t cp, bool*) -> uint32_t {
    if (IsUpper(cp)) return u_tolower(cp);
    if (IsLower(cp)) return u_toupper(cp);
    return cp;
  });
}

std::string JinjaTitle(std::string_view s) {
  auto is_delim = [](uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || IsSpace(cp);
  };
  std::string out;
  bool word_start = true;
  for (Cursor c(s); !c.done();) {
    const size_t start = c.pos();
    const uint32_t cp = c.Next();
    const std::string_view ch = s.substr(start, c.pos() - start);
    out += word_start ? Upper(ch) : Lower(ch);
    word_start = is_delim(cp);
  }
  return out;
}

// ---- methods

std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  const std::u32string set = chars ? Decode(*chars) : std::u32string();
  auto strippable = [&](uint32_t cp) {
    return chars ? set.find(static_cast<char32_t>(cp)) != std::u32string::npos : IsSpace(cp);
  };
  size_t begin = 0, end = s.size();
  if (left) {
    for (Cursor c(s); !c.done() && strippable(c.Next());) begin = c.pos();
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      if (!strippable(Decode(s.substr(start, end - start))[0])) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  uint64_t budget = maxsplit < 0 ? UINT64_MAX : static_cast<uint64_t>(maxsplit);
  if (sep) {
    if (sep->empty()) ThrowRuntime("empty separator");
    size_t i = 0;
    for (size_t pos; budget > 0 && (pos = s.find(*sep, i)) != std::string_view::npos; --budget) {
      out.emplace_back(s.substr(i, pos - i));
      i = pos + sep->size();
    }
    out.emplace_back(s.substr(i));
    return out;
  }
  const std::u32string cps = Decode(s);
  size_t i = 0;
  const size_t n = cps.size();
  for (; budget > 0; --budget) {
    while (i < n && IsSpace(cps[i])) ++i;
    if (i == n) break;
    size_t j = i;
    while (j < n && !IsSpace(cps[j])) ++j;
    out.push_back(Encode(std::u32string_view(cps).substr(i, j - i)));
    i = j;
  }
  while (i < n && IsSpace(cps[i])) ++i;
  if (i < n) out.push_back(Encode(std::u32string_view(cps).substr(i)));
  return out;
}

std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> out;
  uint64_t budget = maxsplit < 0 ? UINT64_MAX : static_cast<uint64_t>(maxsplit);
  if (sep) {
    if (sep->empty()) ThrowRuntime("empty separator");
    size_t end = s.size();
    for (; budget > 0 && end >= sep->size(); --budget) {
      const size_t pos = s.rfind(*sep, end - sep->size());
      if (pos == std::string_view::npos) break;
      out.emplace_back(s.substr(pos + sep->size(), end - pos - sep->size()));
      end = pos;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    const std::u32string cps = Decode(s);
    size_t j = cps.size();
    for (; budget > 0; --budget) {
      while (j > 0 && IsSpace(cps[j - 1])) --j;
      if (j == 0) break;
      size_t i = j;
      while (i > 0 && !IsSpace(cps[i - 1])) --i;
      out.push_back(Encode(std::u32string_view(cps).substr(i, j - i)));
      j = i;
    }
    while (j > 0 && IsSpace(cps[j - 1])) --j;
    if (j > 0) out.push_back(Encode(std::u32string_view(cps).substr(0, j)));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t line_start = 0;
  for (Cursor c(s); !c.done();) {
    const size_t at = c.pos();
    const uint32_t cp = c.Next();
    if (!IsLineBreak(cp)) continue;
    size_t end = c.pos();
    if (cp == '\r' && end < s.size() && s[end] == '\n') c.Next(), ++end;
    out.emplace_back(s.substr(line_start, (keepends ? end : at) - line_start));
    line_start = end;
  }
  if (line_start < s.size()) out.emplace_back(s.substr(line_start));
  return out;
}

std::string Replace(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count) {
  uint64_t budget = count < 0 ? UINT64_MAX : static_cast<uint64_t>(count);
  std::string out;
  if (old.empty()) {
    Cursor c(s);
    for (; budget > 0; --budget) {
      out += repl;
      if (c.done()) return out;
      const size_t start = c.pos();
      c.Next();
      out += s.substr(start, c.pos() - start);
    }
    return out + std::string(s.substr(c.pos()));
  }
  size_t i = 0;
  for (size_t pos; budget > 0 && (pos = s.find(old, i)) != std::string_view::npos; --budget) {
    out.append(s.substr(i, pos - i)).append(repl);
    i = pos + old.size();
  }
  return out.append(s.substr(i));
}

int64_t Find(std::string_view s, std::string_view sub, std::optional<int64_t> start,
             std::optional<int64_t> end, bool reverse) {
  const std::u32string hay = Decode(s), needle = Decode(sub);
  const int64_t n = static_cast<int64_t>(hay.size());
  const int64_t b = AdjustBound(start, n, 0), e = AdjustBound(end, n, n);
  if (e - b < static_cast<int64_t>(needle.size())) return -1;
  const std::u32string_view window = std::u32string_view(hay).substr(b, e - b);
  const size_t pos = reverse ? window.rfind(needle) : window.find(needle);
  return pos == std::u32string_view::npos ? -1 : b + static_cast<int64_t>(pos);
}

int64_t Count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return Length(s) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size()))
    ++n;
  return n;
}

std::string Pad(std::string_view s, int64_t width, uint32_t fill, int align) {
  const int64_t margin = width - Length(s);
  if (margin <= 0) return std::string(s);
  int64_t left = align < 0 ? 0 : align > 0 ? margin : margin / 2 + (margin & width & 1);
  std::string f;
  AppendCodepoint(fill, &f);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = left; i < margin; ++i) out += f;
  return out;
}

// ---- slicing

std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  if (st == 0) ThrowRuntime("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(i);
  return out;
}

int64_t NormalizeIndex(int64_t index, int64_t n) {
  if (index < 0) index += n;
  return index < 0 || index >= n ? -1 : index;
}

// ---- repr

std::string Repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const char quote = has_single && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, quote);
  for (Cursor c(s); !c.done();) {
    const uint32_t cp = c.Next();
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && !IsPrintable(cp))) {
      const char* fmt = cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x";
      std::snprintf(buf, sizeof(buf), fmt, cp);
      out += buf;
    } else {
      AppendCodepoint(cp, &out);
    }
  }
  out += quote;
  return out;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string_view sci(buf, res.ptr - buf);  // "-1.2345e+02"
  const size_t e_pos = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (char ch : sci.substr(negative, e_pos - negative)) {
    if (ch != '.') digits += ch;
  }
  int exp = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+'), sci.data() + sci.size(), exp);
  const int decpt = exp + 1, ndigits = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
    if (decpt >= ndigits) return out + digits + std::string(decpt - ndigits, '0') + ".0";
    return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  out += digits.substr(0, 1);
  if (ndigits > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof(buf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + buf;
}

}  // namespace specula::jinja::py
