#include "engine/grammar/json_rules.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;

Symbol Byte(char c) { return B::Bytes(ByteSet::Of(std::string_view(&c, 1))); }
Symbol Range(uint8_t lo, uint8_t hi) { return B::Bytes(ByteSet::Range(lo, hi)); }
Symbol Set(std::string_view bytes) { return B::Bytes(ByteSet::Of(bytes)); }
Symbol Digit() { return Range('0', '9'); }

Alternative Join(std::initializer_list<Alternative> parts) {
  Alternative all;
  for (const Alternative& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// Alternatives for the decimal strings from `lo` to `hi`, both of the same length: digit by
// digit, the shared prefix, then the low end's tail, the digits between, the high end's tail.
void SameLengthRange(std::string_view lo, std::string_view hi, Alternative prefix,
                     std::vector<Alternative>* out) {
  size_t i = 0;
  while (i < lo.size() && lo[i] == hi[i]) prefix.push_back(Byte(lo[i++]));
  if (i == lo.size()) {
    out->push_back(std::move(prefix));
    return;
  }
  const size_t rest = lo.size() - i - 1;
  auto any_tail = [rest](Alternative a) {
    for (size_t k = 0; k < rest; ++k) a.push_back(Digit());
    return a;
  };
  const bool lo_tail_zero = lo.substr(i + 1).find_first_not_of('0') == std::string_view::npos;
  const bool hi_tail_nine = hi.substr(i + 1).find_first_not_of('9') == std::string_view::npos;
  // Leading digits whose whole tail range is taken: lo[i] (if its tail is all zeros) through
  // hi[i] (if its tail is all nines).
  const char first = lo_tail_zero ? lo[i] : static_cast<char>(lo[i] + 1);
  const char last = hi_tail_nine ? hi[i] : static_cast<char>(hi[i] - 1);
  if (!lo_tail_zero) {
    Alternative low = prefix;
    low.push_back(Byte(lo[i]));
    SameLengthRange(lo.substr(i + 1), std::string(rest, '9'), std::move(low), out);
  }
  if (first <= last) {
    Alternative middle = prefix;
    middle.push_back(Range(static_cast<uint8_t>(first), static_cast<uint8_t>(last)));
    out->push_back(any_tail(std::move(middle)));
  }
  if (!hi_tail_nine) {
    Alternative high = prefix;
    high.push_back(Byte(hi[i]));
    SameLengthRange(std::string(rest, '0'), hi.substr(i + 1), std::move(high), out);
  }
}

}  // namespace

void MagnitudeRange(int64_t lo, int64_t hi, const Alternative& prefix,
                    std::vector<Alternative>* out) {
  ForEachDigitCount(lo, hi, [&](const std::string& low, const std::string& high) {
    SameLengthRange(low, high, prefix, out);
  });
}

int32_t JsonRules::IntegerRange(int64_t lo, int64_t hi) {
  std::vector<Alternative> alternatives;
  if (lo < 0) MagnitudeRange(std::max<int64_t>(1, -hi), -lo, {Byte('-')}, &alternatives);
  if (hi >= 0) MagnitudeRange(std::max<int64_t>(0, lo), hi, {}, &alternatives);
  return b_.AddRule(absl::StrCat("integer_", lo, "_", hi), std::move(alternatives));
}

int32_t JsonRules::Once(std::optional<int32_t>& slot, int32_t (JsonRules::*make)()) {
  if (!slot) slot = (this->*make)();
  return *slot;
}

int32_t JsonRules::Whitespace() { return Once(ws_, &JsonRules::MakeWhitespace); }
int32_t JsonRules::Char() { return Once(char_, &JsonRules::MakeChar); }
int32_t JsonRules::Integer() { return Once(integer_, &JsonRules::MakeInteger); }
int32_t JsonRules::Number() { return Once(number_, &JsonRules::MakeNumber); }
int32_t JsonRules::Boolean() { return Once(boolean_, &JsonRules::MakeBoolean); }
int32_t JsonRules::Null() { return Once(null_, &JsonRules::MakeNull); }
int32_t JsonRules::AnyValue() { return Once(any_value_, &JsonRules::MakeAnyValue); }
int32_t JsonRules::AnyObject() {
  AnyValue();  // makes the object rule too: the two refer to each other
  return *any_object_;
}
int32_t JsonRules::Date() { return Once(date_, &JsonRules::MakeDate); }
int32_t JsonRules::Time() { return Once(time_, &JsonRules::MakeTime); }
int32_t JsonRules::Uuid() { return Once(uuid_, &JsonRules::MakeUuid); }
int32_t JsonRules::DateTime() {
  if (!date_time_) {
    date_time_ = b_.AddRule("date_time",
                            {{Byte('"'), B::Ref(Once(date_body_, &JsonRules::DateBody)), Byte('T'),
                              B::Ref(Once(time_body_, &JsonRules::TimeBody)), Byte('"')}});
  }
  return *date_time_;
}

// At most one line break, then at most max_whitespace spaces or tabs: room for indentation, and
// little for a model that would pad forever.
int32_t JsonRules::MakeWhitespace() {
  const int32_t blank = b_.AddRule("blank", {{Set(" \t")}});
  const int32_t indent = b_.Repeat("indent", blank, 0, max_whitespace_);
  return b_.AddRule(
      "ws",
      {{B::Ref(indent)}, {Byte('\n'), B::Ref(indent)}, {Byte('\r'), Byte('\n'), B::Ref(indent)}});
}

// One character of a JSON string: unescaped ASCII but the quote, the backslash and controls;
// a well-formed UTF-8 sequence (no overlongs, no surrogates); a short escape; or \uXXXX outside
// the surrogates (a lone surrogate is not text: several parsers refuse it).
int32_t JsonRules::MakeChar() {
  ByteSet ascii = ByteSet::Range(0x20, 0x21);
  ascii.Add(0x23, 0x5B);
  ascii.Add(0x5D, 0x7F);
  const Symbol tail = Range(0x80, 0xBF);
  const Symbol hex = Set("0123456789abcdefABCDEF");
  return b_.AddRule("char", {{B::Bytes(ascii)},
                             {Range(0xC2, 0xDF), tail},
                             {Byte('\xE0'), Range(0xA0, 0xBF), tail},
                             {Range(0xE1, 0xEC), tail, tail},
                             {Byte('\xED'), Range(0x80, 0x9F), tail},
                             {Range(0xEE, 0xEF), tail, tail},
                             {Byte('\xF0'), Range(0x90, 0xBF), tail, tail},
                             {Range(0xF1, 0xF3), tail, tail, tail},
                             {Byte('\xF4'), Range(0x80, 0x8F), tail, tail},
                             {Byte('\\'), Set("\"\\/bfnrt")},
                             {Byte('\\'), Byte('u'), Set("0123456789abcABC"), hex, hex, hex},
                             {Byte('\\'), Byte('u'), Set("dD"), Range('0', '7'), hex, hex},
                             {Byte('\\'), Byte('u'), Set("efEF"), hex, hex, hex}});
}

int32_t JsonRules::String(int64_t min, int64_t max) {
  const auto [it, added] = strings_.try_emplace({min, max}, -1);
  if (added) {
    const int32_t chars = b_.Repeat(absl::StrCat("chars_", min, "_", max), Char(), min, max);
    it->second = b_.AddRule("string", {{Byte('"'), B::Ref(chars), Byte('"')}});
  }
  return it->second;
}

int32_t JsonRules::Digits(const std::string& name, int64_t min, int64_t max) {
  return b_.Repeat(name, b_.AddRule("digit", {{Digit()}}), min, max);
}

int32_t JsonRules::MakeInteger() {
  const int32_t magnitude =
      b_.AddRule("magnitude", {{Byte('0')}, {Range('1', '9'), B::Ref(Digits("digits", 0, 14))}});
  return b_.AddRule("integer", {{Byte('-'), B::Ref(magnitude)}, {B::Ref(magnitude)}});
}

int32_t JsonRules::MakeNumber() {
  const int32_t fraction =
      b_.AddRule("fraction", {{Byte('.'), B::Ref(Digits("fraction_digits", 1, 15))}, {}});
  const int32_t exponent =
      b_.AddRule("exponent", {{Set("eE"), B::Ref(b_.AddRule("sign", {{Set("+-")}, {}})),
                               B::Ref(Digits("exponent_digits", 1, 2))},
                              {}});
  return b_.AddRule("number", {{B::Ref(Integer()), B::Ref(fraction), B::Ref(exponent)}});
}

int32_t JsonRules::MakeBoolean() { return LiteralChoice("boolean", {"true", "false"}); }
int32_t JsonRules::MakeNull() { return b_.AddRule("null", {B::Literal("null")}); }

int32_t JsonRules::MakeAnyValue() {
  const int32_t value = b_.NewRule("value");
  any_value_ = value;
  any_object_ = Map("object", value);
  for (const int32_t r :
       {*any_object_, Array("array", value, 0, -1), String(0, -1), Number(), Boolean(), Null()}) {
    b_.AddAlternative(value, {B::Ref(r)});
  }
  return value;
}

int32_t JsonRules::Map(const std::string& name, int32_t value, int32_t key, int64_t min,
                       int64_t max) {
  const Symbol ws = B::Ref(Whitespace());
  const int32_t names = key >= 0 ? key : String(0, -1);
  const int32_t member =
      b_.AddRule(name + "_member", {{B::Ref(names), ws, Byte(':'), ws, B::Ref(value), ws}});
  const int32_t rule = b_.NewRule(name);
  if (min == 0) b_.AddAlternative(rule, {Byte('{'), ws, Byte('}')});
  if (max == 0) return rule;
  const int32_t more = b_.AddRule(name + "_more", {{Byte(','), ws, B::Ref(member)}});
  const int32_t rest =
      b_.Repeat(name + "_members", more, std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
  b_.AddAlternative(rule, {Byte('{'), ws, B::Ref(member), B::Ref(rest), Byte('}')});
  return rule;
}

int32_t JsonRules::Array(const std::string& name, int32_t item, int64_t min, int64_t max) {
  const Symbol ws = B::Ref(Whitespace());
  const int32_t rule = b_.NewRule(name);
  if (min == 0) b_.AddAlternative(rule, {Byte('['), ws, Byte(']')});
  if (max == 0) return rule;
  const int32_t element = b_.AddRule(name + "_item", {{B::Ref(item), ws}});
  const int32_t more = b_.AddRule(name + "_more", {{Byte(','), ws, B::Ref(element)}});
  const int32_t rest =
      b_.Repeat(name + "_items", more, std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
  b_.AddAlternative(rule, {Byte('['), ws, B::Ref(element), B::Ref(rest), Byte(']')});
  return rule;
}

int32_t JsonRules::Tuple(const std::string& name, const std::vector<int32_t>& positions,
                         int32_t extra, int64_t min, int64_t max) {
  const auto n = static_cast<int64_t>(positions.size());
  if (n == 0) return Array(name, extra, min, extra >= 0 ? max : 0);
  const Symbol ws = B::Ref(Whitespace());
  // `after` is what may follow the first k items (k from n down to 1), each after a comma.
  int32_t after = b_.AddRule(name + "_end", {{}});
  if (extra >= 0) {
    const int32_t more = b_.AddRule(name + "_more", {{Byte(','), ws, B::Ref(extra), ws}});
    after = b_.Repeat(name + "_extra", more, std::max<int64_t>(min - n, 0), max < 0 ? -1 : max - n);
  }
  for (int64_t k = n - 1; k >= 1; --k) {
    std::vector<Alternative> alternatives{{Byte(','), ws, B::Ref(positions[k]), ws, B::Ref(after)}};
    if (k >= min) alternatives.push_back({});
    after = b_.AddRule(name + "_at", std::move(alternatives));
  }
  const int32_t rule = b_.NewRule(name);
  if (min == 0) b_.AddAlternative(rule, {Byte('['), ws, Byte(']')});
  if (max != 0) {
    b_.AddAlternative(rule, {Byte('['), ws, B::Ref(positions[0]), ws, B::Ref(after), Byte(']')});
  }
  return rule;
}

std::optional<int32_t> JsonRules::Subsequence(const std::string& name,
                                              const std::vector<int32_t>& items, int64_t min,
                                              int64_t max) {
  const auto n = static_cast<int64_t>(items.size());
  if (max < 0 || max > n) max = n;
  if (min > max) return std::nullopt;
  const Symbol ws = B::Ref(Whitespace());
  // pick[i][c]: one of items i.. (the skipped ones never after), then what may follow c + 1
  // items; after[i][c]: the end, or a comma and a pick from i on. Built from the back; -1 where
  // no array can be finished from there (too few items left for min, or max reached).
  std::vector<std::vector<int32_t>> pick(n + 1, std::vector<int32_t>(max + 1, -1));
  std::vector<std::vector<int32_t>> after(n + 1, std::vector<int32_t>(max + 1, -1));
  for (int64_t i = n; i >= 0; --i) {
    for (int64_t c = max; c >= 0; --c) {
      if (c + (n - i) < min) continue;  // too few items left
      if (i < n && c < max) {
        std::vector<Alternative> alternatives;
        if (after[i + 1][c + 1] >= 0) {
          alternatives.push_back({B::Ref(items[i]), ws, B::Ref(after[i + 1][c + 1])});
        }
        if (pick[i + 1][c] >= 0) alternatives.push_back({B::Ref(pick[i + 1][c])});
        if (!alternatives.empty()) pick[i][c] = b_.AddRule(name + "_pick", std::move(alternatives));
      }
      std::vector<Alternative> alternatives;
      if (c >= min) alternatives.push_back({});
      if (pick[i][c] >= 0) alternatives.push_back({Byte(','), ws, B::Ref(pick[i][c])});
      if (!alternatives.empty()) after[i][c] = b_.AddRule(name + "_after", std::move(alternatives));
    }
  }
  const int32_t rule = b_.NewRule(name);
  if (min == 0) b_.AddAlternative(rule, {Byte('['), ws, Byte(']')});
  if (max > 0 && pick[0][0] >= 0) {
    b_.AddAlternative(rule, {Byte('['), ws, B::Ref(pick[0][0]), Byte(']')});
  }
  return rule;
}

int32_t JsonRules::DateBody() {
  const Symbol d = Digit();
  const int32_t day28 = b_.AddRule(
      "day28", {{Byte('0'), Range('1', '9')}, {Byte('1'), d}, {Byte('2'), Range('0', '8')}});
  const int32_t day30 = b_.AddRule("day30", {{B::Ref(day28)}, B::Literal("29"), B::Literal("30")});
  const int32_t day31 = b_.AddRule("day31", {{B::Ref(day30)}, B::Literal("31")});
  const int32_t long_month = LiteralChoice("month31", {"01", "03", "05", "07", "08", "10", "12"});
  const int32_t short_month = LiteralChoice("month30", {"04", "06", "09", "11"});
  const int32_t month_day =
      b_.AddRule("month_day", {{B::Ref(long_month), Byte('-'), B::Ref(day31)},
                               {B::Ref(short_month), Byte('-'), B::Ref(day30)},
                               Join({B::Literal("02-"), {B::Ref(day28)}})});
  // Years 0001 to 9999: Python's date (jsonschema's format check) has no year 0.
  const Symbol nz = Range('1', '9');
  const int32_t year = b_.AddRule("year", {{Byte('0'), Byte('0'), Byte('0'), nz},
                                           {Byte('0'), Byte('0'), nz, d},
                                           {Byte('0'), nz, d, d},
                                           {nz, d, d, d}});
  return b_.AddRule("date_body", {{B::Ref(year), Byte('-'), B::Ref(month_day)}});
}

int32_t JsonRules::TimeBody() {
  const int32_t hour =
      b_.AddRule("hour", {{Range('0', '1'), Digit()}, {Byte('2'), Range('0', '3')}});
  const int32_t minute = b_.AddRule("minute", {{Range('0', '5'), Digit()}});
  const int32_t offset =
      b_.AddRule("offset", {{Byte('Z')}, {Set("+-"), B::Ref(hour), Byte(':'), B::Ref(minute)}});
  return b_.AddRule("time_body", {{B::Ref(hour), Byte(':'), B::Ref(minute), Byte(':'),
                                   B::Ref(minute), B::Ref(offset)}});
}

int32_t JsonRules::MakeDate() {
  return b_.AddRule("date",
                    {{Byte('"'), B::Ref(Once(date_body_, &JsonRules::DateBody)), Byte('"')}});
}

int32_t JsonRules::MakeTime() {
  return b_.AddRule("time",
                    {{Byte('"'), B::Ref(Once(time_body_, &JsonRules::TimeBody)), Byte('"')}});
}

int32_t JsonRules::MakeUuid() {
  const Symbol h = Set("0123456789abcdef");
  Alternative a{Byte('"')};
  for (const int group : {8, 4, 4, 4, 12}) {
    if (a.size() > 1) a.push_back(Byte('-'));
    a.insert(a.end(), group, h);
  }
  a.push_back(Byte('"'));
  return b_.AddRule("uuid", {std::move(a)});
}

namespace {

// Rules matching exactly one of the sorted, distinct `texts[lo, hi)` from byte `depth` on, all
// of which share their first `depth` bytes.
int32_t Trie(GrammarBuilder& b, const std::string& name, const std::vector<std::string>& texts,
             size_t lo, size_t hi, size_t depth) {
  const int32_t rule = b.NewRule(name);
  size_t i = lo;
  if (texts[i].size() == depth) {  // sorted: the text that ends here comes first
    b.AddAlternative(rule, {});
    ++i;
  }
  while (i < hi) {
    size_t j = i + 1;
    while (j < hi && texts[j][depth] == texts[i][depth]) ++j;
    if (j - i == 1) {
      b.AddAlternative(rule, B::Literal(std::string_view(texts[i]).substr(depth)));
    } else {  // the group's common prefix (first and last share it, being sorted), then a branch
      const std::string& first = texts[i];
      const std::string& last = texts[j - 1];
      size_t common = depth + 1;
      while (common < first.size() && common < last.size() && first[common] == last[common]) {
        ++common;
      }
      Alternative a = B::Literal(std::string_view(first).substr(depth, common - depth));
      a.push_back(B::Ref(Trie(b, name, texts, i, j, common)));
      b.AddAlternative(rule, std::move(a));
    }
    i = j;
  }
  return rule;
}

}  // namespace

int32_t JsonRules::LiteralChoice(const std::string& name, std::vector<std::string> texts) {
  std::sort(texts.begin(), texts.end());
  texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
  if (texts.empty()) return b_.NewRule(name);  // no alternative: Build refuses it
  return Trie(b_, name, texts, 0, texts.size(), 0);
}

}  // namespace specula::grammar
