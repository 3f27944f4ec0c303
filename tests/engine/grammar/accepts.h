// Whether a grammar accepts `text` as a whole sentence: the check the grammar tests share.
#pragma once

#include <memory>
#include <string_view>

#include "engine/grammar/matcher.h"

namespace specula::grammar::testing {

inline bool Accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.Advance(text) && m.CanEnd();
}

}  // namespace specula::grammar::testing
