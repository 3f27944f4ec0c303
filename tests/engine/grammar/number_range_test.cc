// Numbers within bounds (engine/grammar/number_range.h): against a decimal comparison of its
// own, on every combination of integer parts and fractions around each bound, both signs.
#include "engine/grammar/number_range.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;

// A plain decimal "-"?I("."F)? split into sign, integer digits and fraction digits (trailing
// zeros dropped).
struct Decimal {
  bool negative = false;
  std::string integer, fraction;
};

Decimal Split(const std::string& text) {
  Decimal d;
  size_t i = 0;
  if (text[0] == '-') d.negative = true, i = 1;
  const size_t dot = text.find('.');
  d.integer = text.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
  if (dot != std::string::npos) d.fraction = text.substr(dot + 1);
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  return d;
}

// -1, 0, 1 as |a| <, =, > |b|.
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.integer.size() != b.integer.size()) return a.integer.size() < b.integer.size() ? -1 : 1;
  if (a.integer != b.integer) return a.integer < b.integer ? -1 : 1;
  std::string fa = a.fraction, fb = b.fraction;
  fa.resize(std::max(fa.size(), fb.size()), '0');
  fb.resize(fa.size(), '0');
  return fa == fb ? 0 : (fa < fb ? -1 : 1);
}

bool IsZero(const Decimal& d) { return d.integer == "0" && d.fraction.empty(); }

int Compare(const Decimal& a, const Decimal& b) {
  const bool an = a.negative && !IsZero(a), bn = b.negative && !IsZero(b);
  if (an != bn) return an ? -1 : 1;
  const int m = CompareMagnitude(a, b);
  return an ? -m : m;
}

Decimal OfBound(const DecimalBound& b) { return {b.negative, b.integer, b.fraction}; }

bool Within(const std::string& text, const std::optional<DecimalBound>& lo,
            const std::optional<DecimalBound>& hi) {
  const Decimal v = Split(text);
  if (lo) {
    const int c = Compare(v, OfBound(*lo));
    if (c < 0 || (c == 0 && lo->exclusive)) return false;
  }
  if (hi) {
    const int c = Compare(v, OfBound(*hi));
    if (c > 0 || (c == 0 && hi->exclusive)) return false;
  }
  return true;
}

std::shared_ptr<const Grammar> RangeGrammar(const std::optional<DecimalBound>& lo,
                                            const std::optional<DecimalBound>& hi) {
  GrammarBuilder b;
  std::optional<int32_t> rule = NumberRange(b, lo, hi);
  if (!rule) return nullptr;
  auto g = b.Build(*rule);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const Grammar>(*std::move(g));
}

// Plain decimals around the bounds: integer parts near each bound's and far from it, fractions
// just below, at and above each bound's, both signs; none with more than 15 digits.
std::vector<std::string> Candidates(const std::vector<DecimalBound>& bounds) {
  std::vector<std::string> integers = {"0", "1", "2", "9", "10", "99", "100", "12345"};
  std::vector<std::string> fractions = {"", ".0", ".00", ".1", ".5", ".9", ".05", ".999", ".0001"};
  for (const DecimalBound& b : bounds) {
    const long long i = std::stoll(b.integer);
    for (long long k = std::max(0LL, i - 1); k <= i + 1; ++k) integers.push_back(std::to_string(k));
    if (b.fraction.empty()) continue;
    std::string f = b.fraction;
    fractions.push_back("." + f);
    fractions.push_back("." + f + "0");
    fractions.push_back("." + f + "1");
    std::string below = f;
    for (size_t k = below.size(); k-- > 0;) {
      if (below[k] > '0') {
        --below[k];
        break;
      }
    }
    fractions.push_back("." + below);
    fractions.push_back("." + below + "9");
    fractions.push_back("." + f.substr(0, f.size() - 1));
  }
  std::vector<std::string> out;
  for (const std::string& i : integers) {
    for (const std::string& f : fractions) {
      if (i.size() + (f.empty() ? 0 : f.size() - 1) > 15 || f == ".") continue;
      out.push_back(i + f);
      if (!(i == "0" && f.find_first_not_of(".0") == std::string::npos)) out.push_back("-" + i + f);
    }
  }
  return out;
}

DecimalBound Bound(double v, bool exclusive) { return *DecimalBoundOf(v, exclusive); }

TEST(NumberRangeTest, AcceptsExactlyTheDecimalsWithinTheBounds) {
  struct Case {
    std::optional<DecimalBound> lo, hi;
  };
  const std::vector<Case> cases = {
      {Bound(0, false), Bound(1, false)},
      {Bound(0, true), Bound(1, true)},
      {Bound(0, false), std::nullopt},
      {Bound(0, true), std::nullopt},
      {std::nullopt, Bound(2.5, false)},
      {Bound(-1.5, false), Bound(-0.25, true)},
      {Bound(-10, true), Bound(99.95, false)},
      {Bound(0.1, false), Bound(0.1, false)},  // one value
      {Bound(1e-4, true), Bound(2, false)},
      {Bound(9.999, false), Bound(10.001, false)},
      {Bound(-2, false), Bound(-2, true)},  // empty
      {Bound(5, false), Bound(3, false)},   // empty: lo above hi
      {Bound(-3, false), Bound(-5, false)},
      {Bound(5.5, false), Bound(5.2, false)},
      {Bound(12345.678, true), std::nullopt},
      {std::nullopt, Bound(-1e20, false)},        // beyond what is written: none
      {Bound(-1e20, false), Bound(1e20, false)},  // beyond: no bound at all
  };
  for (const Case& c : cases) {
    std::vector<DecimalBound> bounds;
    if (c.lo) bounds.push_back(*c.lo);
    if (c.hi && c.hi->integer.size() <= 15) bounds.push_back(*c.hi);
    if (c.lo && c.lo->integer.size() > 15) bounds.clear();
    const auto g = RangeGrammar(c.lo, c.hi);
    int accepted = 0;
    for (const std::string& text : Candidates(bounds)) {
      const bool within = Within(text, c.lo, c.hi);
      const bool accepts = g != nullptr && Accepts(g, text);
      accepted += accepts;
      ASSERT_EQ(accepts, within) << text << " in [" << (c.lo ? c.lo->integer : "-inf") << "."
                                 << (c.lo ? c.lo->fraction : "") << ", "
                                 << (c.hi ? c.hi->integer : "inf") << "."
                                 << (c.hi ? c.hi->fraction : "") << "]";
    }
    EXPECT_EQ(g == nullptr, accepted == 0);
  }
}

TEST(NumberRangeTest, WritesPlainDecimalsOfAtMost15Digits) {
  const auto g = RangeGrammar(Bound(-1000, false), Bound(1000, false));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Accepts(g, "999.999999999999"));    // 15 digits
  EXPECT_FALSE(Accepts(g, "999.9999999999999"));  // 16
  for (const char* text : {"1e2", "1E2", "-0", "01", "1.", ".5", "+1", "0x1", "- 1", "1.5e0"}) {
    EXPECT_FALSE(Accepts(g, text)) << text;
  }
  EXPECT_TRUE(Accepts(g, "0"));
  EXPECT_TRUE(Accepts(g, "-0.5"));
}

TEST(NumberRangeTest, BoundsAreTheShortestDecimalOfTheirDouble) {
  const DecimalBound tenth = Bound(0.1, false);
  EXPECT_EQ(tenth.integer, "0");
  EXPECT_EQ(tenth.fraction, "1");
  const DecimalBound small = Bound(-1e-7, true);
  EXPECT_TRUE(small.negative && small.exclusive);
  EXPECT_EQ(small.fraction, "0000001");
  EXPECT_FALSE(Bound(-0.0, false).negative);
  EXPECT_FALSE(DecimalBoundOf(std::nan(""), false).ok());
}

// Through a JSON Schema: the tightest bound of each side, exclusive winning a tie.
TEST(NumberRangeTest, SchemaBoundsOnNumbers) {
  auto g = CompileJsonSchema(nlohmann::ordered_json::parse(
      R"({"type": "number", "minimum": 0, "exclusiveMinimum": 0, "maximum": 2, "exclusiveMaximum": 3})"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(Accepts(*g, "0"));
  EXPECT_TRUE(Accepts(*g, "0.001"));
  EXPECT_TRUE(Accepts(*g, "2"));
  EXPECT_FALSE(Accepts(*g, "2.5"));
  g = CompileJsonSchema(nlohmann::ordered_json::parse(R"({"exclusiveMaximum": -0.5})"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "-0.51"));
  EXPECT_FALSE(Accepts(*g, "-0.5"));
  EXPECT_FALSE(Accepts(*g, "\"x\""));  // bounds without a type: numbers
}

}  // namespace
}  // namespace specula::grammar
