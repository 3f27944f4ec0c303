// Multiples of k within bounds (engine/grammar/integer_multiples.h): against arithmetic, for
// every integer near the bounds and for random 15-digit ones.
#include "engine/grammar/integer_multiples.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "engine/grammar/json_rules.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;

std::shared_ptr<const Grammar> Multiples(int64_t lo, int64_t hi, int64_t k) {
  GrammarBuilder b;
  const std::optional<int32_t> rule = IntegerMultiples(b, lo, hi, k);
  if (!rule) return nullptr;
  auto g = b.Build(*rule);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::make_shared<const Grammar>(*std::move(g)) : nullptr;
}

TEST(IntegerMultiplesTest, AcceptsExactlyTheMultiplesWithinTheBounds) {
  constexpr int64_t kMax = JsonRules::kMaxInteger;
  struct Case {
    int64_t lo, hi, k;
  };
  for (const Case c : {Case{-250, 250, 1}, Case{-250, 250, 2}, Case{-1000, 1000, 7},
                       Case{13, 13, 13}, Case{0, 999, 25}, Case{-999, -1, 12}, Case{-kMax, kMax, 3},
                       Case{101, 1099, 100}, Case{-kMax, 5, 999}, Case{-37, kMax, 10}}) {
    const auto g = Multiples(c.lo, c.hi, c.k);
    ASSERT_NE(g, nullptr) << c.lo << " " << c.hi << " " << c.k;
    for (int64_t v = -1100; v <= 1100; ++v) {
      const bool valid = v >= c.lo && v <= c.hi && v % c.k == 0;
      EXPECT_EQ(Accepts(g, std::to_string(v)), valid)
          << v << " in [" << c.lo << ", " << c.hi << "] multiple of " << c.k;
    }
    for (const char* text : {"-0", "00", "007", "+6", "6.0", "", "-"}) {
      EXPECT_FALSE(Accepts(g, text)) << text;
    }
  }
}

TEST(IntegerMultiplesTest, FifteenDigitMultiplesAndNoMore) {
  constexpr int64_t kMax = JsonRules::kMaxInteger;
  std::mt19937_64 rng(3);
  for (const int64_t k : {7, 360, 1000}) {
    const auto g = Multiples(-kMax, kMax, k);
    ASSERT_NE(g, nullptr);
    for (int i = 0; i < 300; ++i) {
      const int64_t v = static_cast<int64_t>(rng() % (2 * kMax + 1)) - kMax;
      EXPECT_EQ(Accepts(g, std::to_string(v)), v % k == 0) << v << " multiple of " << k;
      const int64_t m = v / k * k;  // a multiple, whatever v is
      EXPECT_TRUE(Accepts(g, std::to_string(m))) << m << " multiple of " << k;
    }
    EXPECT_FALSE(Accepts(g, "1000000000000000"));  // 16 digits: past what Integer writes
  }
}

TEST(IntegerMultiplesTest, NullWhenNoMultipleLiesWithinTheBounds) {
  GrammarBuilder b;
  EXPECT_FALSE(IntegerMultiples(b, 1, 6, 7).has_value());
  EXPECT_FALSE(IntegerMultiples(b, -13, -11, 10).has_value());
  EXPECT_TRUE(IntegerMultiples(b, -13, -10, 10).has_value());
}

}  // namespace
}  // namespace specula::grammar
