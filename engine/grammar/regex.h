// ECMAScript regular expressions (engine/grammar/regex_syntax.h lists the dialect) as grammar
// rules: for JSON Schema's `pattern` (inside a JSON string) and for a constraint that is a regex
// over the whole output.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/regex_syntax.h"

namespace specula::grammar {

enum class RegexText : uint8_t {
  kRaw,         // the matched text's UTF-8 bytes
  kJsonString,  // the matched text as the body of a JSON string: `"`, `\` and control characters
                // written as their escapes (\", \\, \n, ..., \u00XX), everything else as UTF-8
};

enum class RegexMatch : uint8_t {
  kWhole,   // the text is one the regex matches as a whole; ^ and $ change nothing
  kSearch,  // ECMAScript's RegExp.test, JSON Schema's `pattern`: the regex matches somewhere in
            // the text, unless ^ / $ anchor a top-level alternative to its start / end
};

struct RegexOptions {
  RegexText text = RegexText::kRaw;
  RegexMatch match = RegexMatch::kWhole;
  RegexLimits limits;
};

// Adds a rule deriving exactly the texts `pattern` accepts (as `options` say) to `b`.
// INVALID_ARGUMENT naming what the dialect does not support, and for a class no character
// satisfies.
absl::StatusOr<int32_t> AddRegex(std::string_view pattern, const RegexOptions& options,
                                 GrammarBuilder& b);

// A grammar of `pattern` alone, refused past `max_symbols` grammar symbols.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegex(std::string_view pattern,
                                                            const RegexOptions& options = {},
                                                            int64_t max_symbols = 1 << 20);

}  // namespace specula::grammar
