// What the grammar tests share: whether a grammar accepts `text` as a whole sentence, and every
// short string over an alphabet (to compare two recognizers exhaustively).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/matcher.h"

namespace specula::grammar::testing {

inline bool Accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.Advance(text) && m.CanEnd();
}

// Every string over `alphabet` of at most `max_length` characters, shortest first.
inline std::vector<std::string> AllStrings(const std::string& alphabet, int max_length) {
  std::vector<std::string> out = {""};
  for (size_t begin = 0, length = 0; length < static_cast<size_t>(max_length); ++length) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (const char c : alphabet) out.push_back(out[i] + c);
    }
    begin = end;
  }
  return out;
}

}  // namespace specula::grammar::testing
