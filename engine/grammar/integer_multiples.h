// JSON Schema's multipleOf for integers: the multiples of k within bounds as a grammar, written
// as JSON writes integers (no leading zeros, "-" before a negative, never "-0").
//
// Digit by digit: a state is the remainder modulo k of the digits so far and whether they still
// equal a bound's leading digits, so the grammar holds exactly the multiples within the bounds.
// Its size grows with k (about 15 * k rules of up to 10 alternatives): k is bounded by
// kMaxMultipleOf.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/grammar/grammar.h"

namespace specula::grammar {

inline constexpr int64_t kMaxMultipleOf = 1000;

// A rule deriving the integers v with lo <= v <= hi and v % k == 0 (1 <= k <= kMaxMultipleOf;
// lo and hi within +-999,999,999,999,999, the 15 digits JsonRules::Integer writes). Null when no
// integer qualifies.
std::optional<int32_t> IntegerMultiples(GrammarBuilder& b, int64_t lo, int64_t hi, int64_t k);

}  // namespace specula::grammar
