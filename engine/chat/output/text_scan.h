// Small string helpers shared by the output stages: holding back text that might be the start
// of a tag, and the whitespace the formats tolerate.
#pragma once

#include <cstddef>
#include <string_view>

namespace specula::chat_output_internal {

// The whitespace JSON allows; the only whitespace the formats skip or drop.
inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Index of the first non-space character of `text` at or after `pos`; text.size() if none.
size_t SkipSpace(std::string_view text, size_t pos);

// Length of the longest suffix of `text` that is a proper prefix of `tag`: the part of a chunk's
// end that the next chunk could complete into `tag`, so it must not be emitted yet.
size_t PartialTagLength(std::string_view text, std::string_view tag);

// `text` without its leading / trailing '\n' characters (Python's str.strip('\n') halves).
std::string_view StripLeadingNewlines(std::string_view text);
std::string_view StripTrailingNewlines(std::string_view text);

}  // namespace specula::chat_output_internal
