// The rules of JSON text itself (whitespace, strings, numbers, literals, any value, a few string
// formats), written into a GrammarBuilder once each and shared by every schema that uses them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/grammar/grammar.h"

namespace specula::grammar {

// Alternatives for the decimal integers from `lo` to `hi` (0 <= lo <= hi), written without
// leading zeros, each after `prefix`; each alternative holds one digit count.
void MagnitudeRange(int64_t lo, int64_t hi, const Alternative& prefix,
                    std::vector<Alternative>* out);

// Calls same_length(low, high) with the decimal strings of [lo, hi] (0 <= lo <= hi) split into
// runs of one digit count: [7, 123] gives ("7", "9"), ("10", "99"), ("100", "123").
template <typename F>
void ForEachDigitCount(int64_t lo, int64_t hi, F same_length) {
  for (int64_t low = lo; low <= hi;) {
    const std::string digits = std::to_string(low);
    int64_t top = 9;  // the largest number with as many digits
    for (size_t k = 1; k < digits.size(); ++k) top = top * 10 + 9;
    const int64_t high = std::min(hi, top);
    same_length(digits, std::to_string(high));
    low = high + 1;
  }
}

class JsonRules {
 public:
  JsonRules(GrammarBuilder& b, int max_whitespace) : b_(b), max_whitespace_(max_whitespace) {}

  // Between tokens: an optional line break (\n or \r\n), then at most max_whitespace spaces or
  // tabs.
  int32_t Whitespace();
  // A string of `min` to `max` characters (max < 0: no bound), quotes included.
  int32_t String(int64_t min, int64_t max);
  int32_t Integer();
  // The integers in [lo, hi] (lo <= hi, both within +-kMaxInteger), written without leading
  // zeros.
  int32_t IntegerRange(int64_t lo, int64_t hi);
  // The largest magnitude Integer() writes: 15 digits.
  static constexpr int64_t kMaxInteger = 999'999'999'999'999;
  int32_t Number();
  int32_t Boolean();
  int32_t Null();
  // Any JSON value; any object.
  int32_t AnyValue();
  int32_t AnyObject();
  // Quoted strings in a format: "YYYY-MM-DD", "HH:MM:SS" with Z or an offset, their join by "T",
  // and a lowercase UUID.
  int32_t Date();
  int32_t Time();
  int32_t DateTime();
  int32_t Uuid();
  // Exactly one of `texts`, with shared prefixes merged so that the grammar stays unambiguous
  // (a 1,000-value enum does not open 1,000 parse stacks).
  int32_t LiteralChoice(const std::string& name, std::vector<std::string> texts);
  // "{" ws ( member ( "," ws member ){min-1, max-1} )? "}" where member ::= key ws ":" ws value ws
  // and key is any string unless `key` (a rule of JSON strings) is given (max < 0: no bound).
  int32_t Map(const std::string& name, int32_t value, int32_t key = -1, int64_t min = 0,
              int64_t max = -1);
  // "[" ws ( item ws ( "," ws item ws ){min-1, max-1} )? "]".
  int32_t Array(const std::string& name, int32_t item, int64_t min, int64_t max);
  // A tuple: position i holds `positions[i]`, positions past them `extra` (< 0: none), from `min`
  // to `max` items (max < 0: no bound; without `extra`, at most positions.size()).
  int32_t Tuple(const std::string& name, const std::vector<int32_t>& positions, int32_t extra,
                int64_t min, int64_t max);
  // An array of `items` in their order, each at most once (some left out), from `min` to `max`
  // items (max < 0: up to all of them): uniqueItems over distinct values. Null when min exceeds
  // the items.
  std::optional<int32_t> Subsequence(const std::string& name, const std::vector<int32_t>& items,
                                     int64_t min, int64_t max);

 private:
  int32_t Char();
  int32_t Digits(const std::string& name, int64_t min, int64_t max);
  int32_t Once(std::optional<int32_t>& slot, int32_t (JsonRules::*make)());
  int32_t MakeWhitespace();
  int32_t MakeChar();
  int32_t MakeInteger();
  int32_t MakeNumber();
  int32_t MakeBoolean();
  int32_t MakeNull();
  int32_t MakeAnyValue();
  int32_t MakeDate();
  int32_t MakeTime();
  int32_t MakeUuid();
  // Unquoted date and time, for Date(), Time() and DateTime().
  int32_t DateBody();
  int32_t TimeBody();

  GrammarBuilder& b_;
  int max_whitespace_;
  std::optional<int32_t> ws_, char_, integer_, number_, boolean_, null_, any_value_, any_object_,
      date_, time_, date_time_, uuid_, date_body_, time_body_;
  // String(min, max) by its bounds: properties with the same bounds share the rules, and so the
  // token masker's cache entries.
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int32_t> strings_;
};

}  // namespace specula::grammar
