#include "engine/grammar/integer_multiples.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_rules.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;

// The digit strings of one length between two bounds of that length (as text, which orders them
// as numbers), whose value is a multiple of k. A rule per state: the position, the remainder of
// the digits before it, and whether they still equal each bound's. States off both bounds depend
// only on the digits left and what they must cancel, so every length shares them.
class SameLengthMultiples {
 public:
  SameLengthMultiples(GrammarBuilder& b, int64_t k) : b_(b), k_(k) {}

  // The rule of [lo, hi] (equal lengths, lo <= hi), or nullopt when no multiple lies there.
  std::optional<int32_t> Range(const std::string& lo, const std::string& hi) {
    lo_ = lo;
    hi_ = hi;
    tight_.clear();
    return State(0, 0, true, true);
  }

 private:
  using Key = std::tuple<size_t, int64_t, bool, bool>;  // position, remainder, on lo, on hi

  std::optional<int32_t> State(size_t pos, int64_t remainder, bool on_lo, bool on_hi) {
    // A bound whose remaining digits are all 0 (lo) or all 9 (hi) no longer narrows anything.
    on_lo = on_lo && lo_.find_first_not_of('0', pos) != std::string::npos;
    on_hi = on_hi && hi_.find_first_not_of('9', pos) != std::string::npos;
    const size_t left = lo_.size() - pos;
    if (left == 0) {
      if (remainder != 0) return std::nullopt;
      return Memo(free_, {0, 0, false, false}, [&] { return b_.AddRule("multiple_end", {{}}); });
    }
    auto build = [&]() -> std::optional<int32_t> { return Build(pos, remainder, on_lo, on_hi); };
    if (!on_lo && !on_hi) {
      // Two remainders whose digits to come must cancel the same amount (remainder * 10^left mod
      // k) are one state: for k = 1000 every remainder is one once three digits are left.
      int64_t shifted = remainder;
      for (size_t i = 0; i < left; ++i) shifted = shifted * 10 % k_;
      return Memo(free_, {left, shifted, false, false}, build);
    }
    return Memo(tight_, {pos, remainder, on_lo, on_hi}, build);
  }

  // Alternatives grouped by the state they lead to: digits d with the same next state share one
  // byte set.
  std::optional<int32_t> Build(size_t pos, int64_t remainder, bool on_lo, bool on_hi) {
    const int first = on_lo ? lo_[pos] - '0' : 0;
    const int last = on_hi ? hi_[pos] - '0' : 9;
    std::vector<std::pair<int32_t, ByteSet>> nexts;
    for (int d = first; d <= last; ++d) {
      const std::optional<int32_t> next =
          State(pos + 1, (remainder * 10 + d) % k_, on_lo && d == first, on_hi && d == last);
      if (!next) continue;
      auto it =
          std::find_if(nexts.begin(), nexts.end(), [&](const auto& n) { return n.first == *next; });
      if (it == nexts.end()) it = nexts.insert(nexts.end(), {*next, ByteSet()});
      it->second.Add(static_cast<uint8_t>('0' + d), static_cast<uint8_t>('0' + d));
    }
    if (nexts.empty()) return std::nullopt;
    std::vector<Alternative> alternatives;
    for (const auto& [next, digits] : nexts) {
      alternatives.push_back({B::Bytes(digits), B::Ref(next)});
    }
    return b_.AddRule("multiple_digits", std::move(alternatives));
  }

  template <typename Make>
  std::optional<int32_t> Memo(std::map<Key, std::optional<int32_t>>& memo, const Key& key,
                              Make make) {
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    const std::optional<int32_t> rule = make();
    memo.emplace(key, rule);
    return rule;
  }

  GrammarBuilder& b_;
  const int64_t k_;
  std::string lo_, hi_;
  // (digits left, remainder * 10^left mod k): any length's
  std::map<Key, std::optional<int32_t>> free_;
  std::map<Key, std::optional<int32_t>> tight_;  // on a bound: this length's only
};

// Alternatives for the magnitudes in [lo, hi] (0 <= lo <= hi) that are multiples of k, each
// after `prefix`, one length at a time.
void Magnitudes(SameLengthMultiples& lengths, int64_t lo, int64_t hi, const Alternative& prefix,
                std::vector<Alternative>* out) {
  ForEachDigitCount(lo, hi, [&](const std::string& low, const std::string& high) {
    if (const std::optional<int32_t> rule = lengths.Range(low, high)) {
      Alternative a = prefix;
      a.push_back(B::Ref(*rule));
      out->push_back(std::move(a));
    }
  });
}

}  // namespace

std::optional<int32_t> IntegerMultiples(GrammarBuilder& b, int64_t lo, int64_t hi, int64_t k) {
  SameLengthMultiples lengths(b, k);
  std::vector<Alternative> alternatives;
  if (lo < 0) {
    Magnitudes(lengths, std::max<int64_t>(1, -hi), -lo, {B::Bytes(ByteSet::Of("-"))},
               &alternatives);
  }
  if (hi >= 0) Magnitudes(lengths, std::max<int64_t>(0, lo), hi, {}, &alternatives);
  if (alternatives.empty()) return std::nullopt;
  return b.AddRule(absl::StrCat("multiples_of_", k), std::move(alternatives));
}

}  // namespace specula::grammar
