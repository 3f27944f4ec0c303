#include "engine/grammar/number_range.h"

#include <charconv>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_rules.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;

constexpr int kMaxDigits = 15;  // significant digits a double tells apart (DBL_DIG)

// One side of a magnitude's fraction: its digits and whether equality is excluded.
struct FractionBound {
  std::string digits;
  bool strict = false;
};

// Fractions of a magnitude whose integer part is fixed: "" (zero) or "." and 1 to `budget`
// digits, with lo <= fraction <= hi (< where strict; nullopt: no bound). A state is how much of
// each bound's digits the fraction has matched so far (-1: it is already past that bound).
class FractionRules {
 public:
  FractionRules(GrammarBuilder& b, std::optional<FractionBound> lo, std::optional<FractionBound> hi,
                int budget)
      : b_(b), lo_(std::move(lo)), hi_(std::move(hi)), budget_(budget) {}

  // The fraction part's rule; nullopt when no fraction satisfies the bounds.
  std::optional<int32_t> Build() {
    const int l0 = lo_ ? 0 : -1, h0 = hi_ ? 0 : -1;
    std::vector<Alternative> alternatives;
    if (Accepting(l0, h0)) alternatives.push_back({});
    if (budget_ > 0) {
      for (Alternative& a : DigitAlternatives(0, l0, h0)) {
        a.insert(a.begin(), B::Bytes(ByteSet::Of(".")));
        alternatives.push_back(std::move(a));
      }
    }
    if (alternatives.empty()) return std::nullopt;
    return b_.AddRule("fraction_range", std::move(alternatives));
  }

 private:
  static constexpr int kDead = -2;

  // Whether the fraction may end with `l` / `h` matched.
  bool Accepting(int l, int h) const {
    const bool lo_ok = l == -1 || (l == static_cast<int>(lo_->digits.size()) && !lo_->strict);
    const bool hi_ok = h == -1 || h < static_cast<int>(hi_->digits.size()) || !hi_->strict;
    return lo_ok && hi_ok;
  }

  int NextLo(int l, char c) const {
    if (l == -1) return -1;
    const std::string& d = lo_->digits;
    const char bound = l < static_cast<int>(d.size()) ? d[l] : '0';  // zeros past its digits
    if (c > bound) return -1;
    if (c < bound) return kDead;
    return l < static_cast<int>(d.size()) ? l + 1 : l;
  }

  int NextHi(int h, char c) const {
    if (h == -1) return -1;
    const std::string& d = hi_->digits;
    const char bound = h < static_cast<int>(d.size()) ? d[h] : '0';
    if (c < bound) return -1;
    if (c > bound) return kDead;
    return h < static_cast<int>(d.size()) ? h + 1 : h;
  }

  // One alternative per set of digits that lead to the same next state, from the `pos`-th digit.
  std::vector<Alternative> DigitAlternatives(int pos, int l, int h) {
    std::map<std::pair<int, int>, ByteSet> groups;
    for (char c = '0'; c <= '9'; ++c) {
      const int nl = NextLo(l, c), nh = NextHi(h, c);
      if (nl == kDead || nh == kDead) continue;
      groups[{nl, nh}].Add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
    }
    std::vector<Alternative> out;
    for (const auto& [next, digits] : groups) {
      if (std::optional<int32_t> rest = More(pos + 1, next.first, next.second)) {
        out.push_back({B::Bytes(digits), B::Ref(*rest)});
      }
    }
    return out;
  }

  // The digits after the `pos`-th, possibly none; nullopt when no way on satisfies the bounds.
  std::optional<int32_t> More(int pos, int l, int h) {
    const auto key = std::make_tuple(pos, l, h);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::vector<Alternative> alternatives;
    if (Accepting(l, h)) alternatives.push_back({});
    if (pos < budget_) {
      for (Alternative& a : DigitAlternatives(pos, l, h)) alternatives.push_back(std::move(a));
    }
    std::optional<int32_t> rule;
    if (!alternatives.empty()) rule = b_.AddRule("fraction_digits", std::move(alternatives));
    memo_[key] = rule;
    return rule;
  }

  GrammarBuilder& b_;
  const std::optional<FractionBound> lo_, hi_;
  const int budget_;
  std::map<std::tuple<int, int, int>, std::optional<int32_t>> memo_;
};

// A bound on a magnitude (the number without its sign).
struct MagnitudeBound {
  int64_t integer = 0;
  FractionBound fraction;
};

std::optional<MagnitudeBound> MagnitudeOf(const DecimalBound& d) {
  if (d.integer.size() > static_cast<size_t>(kMaxDigits)) return std::nullopt;
  return MagnitudeBound{std::stoll(d.integer), {d.fraction, d.exclusive}};
}

// Alternatives for integer parts [lo, hi], each followed by its fraction rule: the fraction's
// digits are what the integer part leaves of kMaxDigits.
void WithFractions(GrammarBuilder& b, int64_t lo, int64_t hi, const Alternative& prefix,
                   const std::optional<FractionBound>& flo, const std::optional<FractionBound>& fhi,
                   std::vector<Alternative>* out) {
  if (lo > hi) return;
  std::vector<Alternative> integers;
  MagnitudeRange(lo, hi, prefix, &integers);
  std::map<int, std::optional<int32_t>> by_budget;
  for (Alternative& a : integers) {
    const int budget = kMaxDigits - static_cast<int>(a.size() - prefix.size());
    auto [it, added] = by_budget.try_emplace(budget);
    if (added) it->second = FractionRules(b, flo, fhi, budget).Build();
    if (!it->second) continue;
    a.push_back(B::Ref(*it->second));
    out->push_back(std::move(a));
  }
}

// Alternatives for the magnitudes m with lo <= m <= hi (hi nullopt: no bound), after `prefix`.
void MagnitudeRangeWithFractions(GrammarBuilder& b, const MagnitudeBound& lo,
                                 const std::optional<MagnitudeBound>& hi, const Alternative& prefix,
                                 std::vector<Alternative>* out) {
  constexpr int64_t kMax = JsonRules::kMaxInteger;
  if (!hi) {
    WithFractions(b, lo.integer, lo.integer, prefix, lo.fraction, std::nullopt, out);
    WithFractions(b, lo.integer + 1, kMax, prefix, std::nullopt, std::nullopt, out);
    return;
  }
  if (lo.integer > hi->integer) return;
  if (lo.integer == hi->integer) {
    WithFractions(b, lo.integer, lo.integer, prefix, lo.fraction, hi->fraction, out);
    return;
  }
  WithFractions(b, lo.integer, lo.integer, prefix, lo.fraction, std::nullopt, out);
  WithFractions(b, lo.integer + 1, hi->integer - 1, prefix, std::nullopt, std::nullopt, out);
  WithFractions(b, hi->integer, hi->integer, prefix, std::nullopt, hi->fraction, out);
}

bool IsZero(const DecimalBound& d) { return d.integer == "0" && d.fraction.empty(); }

}  // namespace

absl::StatusOr<DecimalBound> DecimalBoundOf(double value, bool exclusive) {
  if (!std::isfinite(value)) return absl::InvalidArgumentError("a bound must be a finite number");
  char buffer[512];
  const auto [end, ec] =
      std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(value), std::chars_format::fixed);
  if (ec != std::errc()) return absl::InvalidArgumentError("a bound too long to write");
  const std::string text(buffer, end);
  DecimalBound d;
  d.negative = std::signbit(value);
  d.exclusive = exclusive;
  const size_t dot = text.find('.');
  d.integer = text.substr(0, dot);
  if (dot != std::string::npos) d.fraction = text.substr(dot + 1);
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  if (IsZero(d)) d.negative = false;  // -0 is 0
  return d;
}

std::optional<int32_t> NumberRange(GrammarBuilder& b, const std::optional<DecimalBound>& lo,
                                   const std::optional<DecimalBound>& hi) {
  std::vector<Alternative> alternatives;
  // v >= 0, written without a sign: magnitudes from max(lo, 0) to hi.
  if (!(hi && hi->negative)) {
    const std::optional<MagnitudeBound> low =
        lo && !lo->negative ? MagnitudeOf(*lo) : MagnitudeBound{0, {"", false}};
    const std::optional<MagnitudeBound> high = hi ? MagnitudeOf(*hi) : std::nullopt;
    if (low) MagnitudeRangeWithFractions(b, *low, high, {}, &alternatives);
  }
  // v < 0, written "-" then a magnitude above 0: from |hi| (or just above 0) to |lo|.
  if (!(lo && !lo->negative)) {
    const std::optional<MagnitudeBound> low =
        hi && hi->negative ? MagnitudeOf(*hi) : MagnitudeBound{0, {"", true}};
    const std::optional<MagnitudeBound> high = lo ? MagnitudeOf(*lo) : std::nullopt;
    if (low)
      MagnitudeRangeWithFractions(b, *low, high, {B::Bytes(ByteSet::Of("-"))}, &alternatives);
  }
  if (alternatives.empty()) return std::nullopt;
  return b.AddRule("number_range", std::move(alternatives));
}

}  // namespace specula::grammar
