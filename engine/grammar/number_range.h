// JSON numbers within bounds (JSON Schema's minimum / maximum / exclusiveMinimum /
// exclusiveMaximum on a `number`), written as plain decimals: "-"? integer ("." digits)?, no
// exponent, at most 15 significant digits in all. Digit by digit against the bounds' decimal
// digits, so the grammar holds exactly the decimals within them.
//
// 15 digits is what a double tells apart (DBL_DIG): two such decimals on either side of a bound
// stay on either side once a validator reads them as doubles, so what the grammar writes is valid
// to a validator comparing doubles too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace specula::grammar {

// A bound as decimal digits: the magnitude's integer and fraction digits (no leading zeros in
// the integer part but "0", no trailing zeros in the fraction), its sign, and whether it is
// exclusive.
struct DecimalBound {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  bool exclusive = false;
};

// The bound a JSON Schema number stands for: the shortest decimal that reads back as the same
// double (0.1 is "0.1", not 0.1000000000000000055...). INVALID_ARGUMENT for NaN or infinity.
absl::StatusOr<DecimalBound> DecimalBoundOf(double value, bool exclusive);

// A rule deriving the numbers v with lo <= v <= hi (< where exclusive; nullopt: no bound). Null
// when no number qualifies. Bounds past 15 integer digits change nothing: none is written.
std::optional<int32_t> NumberRange(GrammarBuilder& b, const std::optional<DecimalBound>& lo,
                                   const std::optional<DecimalBound>& hi);

}  // namespace specula::grammar
