// Cat(...): string concatenation for messages. Debian's Abseil has its own string_view type,
// which absl::StrCat wants, so the interpreter (which uses std::string_view) has this instead.
#pragma once

#include <concepts>
#include <string>
#include <string_view>

namespace specula::jinja {

inline void CatAppend(std::string& out, std::string_view s) { out.append(s); }
inline void CatAppend(std::string& out, char c) { out.push_back(c); }
template <std::integral T>
requires(!std::same_as<T, char> && !std::same_as<T, bool>) void CatAppend(std::string& out, T n) {
  out += std::to_string(n);
}

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (CatAppend(out, args), ...);
  return out;
}

}  // namespace specula::jinja
