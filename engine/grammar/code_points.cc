#include "engine/grammar/code_points.h"

#include <algorithm>

namespace specula::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

// Splits [lo, hi] (scalar values of one encoded length or more) until each piece's first and last
// encodings differ only in ranges of trailing bytes, where every byte between is valid: then
// the piece is one sequence of byte ranges. The classic construction (RE2, Rust's regex-syntax).
void Split(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>& out) {
  if (lo > hi) return;
  for (const uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      Split(lo, max, out);
      Split(max + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Split(lo, lo | m, out);
        Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Split(lo, (hi & ~m) - 1, out);
        Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = EncodeUtf8(lo), b = EncodeUtf8(hi);
  Utf8Sequence seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
  }
  out.push_back(std::move(seq));
}

}  // namespace

CodePointSet CodePointSet::Of(uint32_t lo, uint32_t hi) {
  CodePointSet s;
  s.Add(lo, hi);
  return s;
}

CodePointSet CodePointSet::All() {
  CodePointSet s;
  s.ranges_ = {{0, kSurrogateLo - 1}, {kSurrogateHi + 1, kMaxCodePoint}};
  return s;
}

void CodePointSet::Add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  ranges_.push_back({lo, std::min(hi, kMaxCodePoint)});
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges_) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
}

void CodePointSet::Add(const CodePointSet& other) {
  for (const auto& [lo, hi] : other.ranges_) Add(lo, hi);
}

CodePointSet CodePointSet::Complement() const { return All().Minus(*this); }

CodePointSet CodePointSet::Minus(const CodePointSet& other) const {
  CodePointSet out;
  for (auto [lo, hi] : ranges_) {
    for (const auto& [olo, ohi] : other.ranges_) {
      if (ohi < lo || olo > hi) continue;
      if (olo > lo) out.Add(lo, olo - 1);
      if (ohi >= hi) {
        lo = hi + 1;
        break;
      }
      lo = ohi + 1;
    }
    if (lo <= hi) out.Add(lo, hi);
  }
  return out;
}

CodePointSet CodePointSet::Intersect(const CodePointSet& other) const {
  return Minus(Minus(other));
}

bool CodePointSet::Contains(uint32_t c) const {
  return std::any_of(ranges_.begin(), ranges_.end(),
                     [c](const auto& r) { return r.first <= c && c <= r.second; });
}

std::vector<Utf8Sequence> Utf8Sequences(uint32_t lo, uint32_t hi) {
  std::vector<Utf8Sequence> out;
  hi = std::min(hi, kMaxCodePoint);
  if (lo < kSurrogateLo || hi > kSurrogateHi) {
    Split(lo, std::min(hi, kSurrogateLo - 1), out);
    Split(std::max(lo, kSurrogateHi + 1), hi, out);
  }
  return out;
}

std::string EncodeUtf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::optional<uint32_t> DecodeUtf8(std::string_view text, size_t* i) {
  if (*i >= text.size()) return std::nullopt;
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[*i + k]); };
  const uint8_t lead = byte(0);
  const size_t length = lead < 0x80           ? 1
                        : (lead >> 5) == 0x6  ? 2
                        : (lead >> 4) == 0xE  ? 3
                        : (lead >> 3) == 0x1E ? 4
                                              : 0;
  if (length == 0 || *i + length > text.size()) return std::nullopt;
  uint32_t c = length == 1 ? lead : lead & (0x7Fu >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return std::nullopt;
    c = (c << 6) | (byte(k) & 0x3F);
  }
  static constexpr uint32_t kMinOfLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMinOfLength[length] || c > kMaxCodePoint || (c >= kSurrogateLo && c <= kSurrogateHi)) {
    return std::nullopt;
  }
  *i += length;
  return c;
}

}  // namespace specula::grammar
