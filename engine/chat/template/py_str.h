// Python 3 `str` semantics on UTF-8 strings: lengths, indices and slices count code points;
// whitespace, case and character classes are Unicode's (ICU), as in CPython. Inputs are valid
// UTF-8 (template sources and JSON strings are checked on the way in).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specula::jinja::py {

// ---- code points
std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view cps);
void AppendCodepoint(uint32_t cp, std::string* out);
// Number of code points.
int64_t Length(std::string_view s);
// Code point index of byte offset `byte` (a character boundary).
int64_t CodepointIndex(std::string_view s, size_t byte);

// ---- character classes (str.isspace(), str.isalpha()...)
bool IsSpace(uint32_t cp);
bool IsAlpha(uint32_t cp);
bool IsDecimal(uint32_t cp);
bool IsDigit(uint32_t cp);
bool IsNumeric(uint32_t cp);
bool IsAlnum(uint32_t cp);
bool IsWordChar(uint32_t cp);  // re's \w
bool IsUpper(uint32_t cp);
bool IsLower(uint32_t cp);
bool IsTitle(uint32_t cp);
bool IsPrintable(uint32_t cp);  // str.isprintable(), which repr() follows

// ---- case
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Title(std::string_view s);       // str.title()
std::string Capitalize(std::string_view s);  // str.capitalize()
std::string SwapCase(std::string_view s);
// The `title` filter: words start after '-', whitespace, '(', '{', '[' or '<'.
std::string JinjaTitle(std::string_view s);

// ---- methods. `chars`/`sep` nullopt stand for None.
std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> SplitLines(std::string_view s, bool keepends);
std::string Replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// Code point index of the first (last) occurrence of `sub` in s[start:end], or -1.
int64_t Find(std::string_view s, std::string_view sub, std::optional<int64_t> start,
             std::optional<int64_t> end, bool reverse);
int64_t Count(std::string_view s, std::string_view sub);
std::string Pad(std::string_view s, int64_t width, uint32_t fill, int align);  // -1 l, 0 c, 1 r

// ---- slicing (Python's slice.indices): the selected indices of a sequence of length n.
std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step);
// Normalizes a possibly negative index; -1 when out of range.
int64_t NormalizeIndex(int64_t index, int64_t n);

// ---- repr
std::string Repr(std::string_view s);  // repr(str)
std::string FloatRepr(double d);       // repr(float): 1.0, 0.5, 1e-05, 1e+16, inf, nan

}  // namespace specula::jinja::py
