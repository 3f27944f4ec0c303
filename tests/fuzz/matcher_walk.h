// The fuzz targets' check of a compiled grammar: walk it with the token masker, as the engine
// does, over a vocabulary of every single byte and a few longer tokens.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/matcher.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/grammar/token_mask.h"

namespace specula::fuzz {

// Every single byte, then a few longer tokens.
inline const std::vector<std::string>& WalkTokens() {
  static const std::vector<std::string>* const kTokens = [] {
    auto* tokens = new std::vector<std::string>();
    for (int b = 0; b < 256; ++b) tokens->push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"ab", "((", "))", "\":", "12", "\xC3\xA9", "\xF0\x9F\x98\x80", "<think>",
                          "</think>", "null", "[0", "a+"}) {
      tokens->push_back(t);
    }
    return tokens;
  }();
  return *kTokens;
}

// A vocabulary to walk with, and the store its prepared caches share with every input's grammars
// (as a server's schemas share them). `costly_fraction`: what counts as costly at this size
// (TokenMaskerOptions), to stand for a real vocabulary's 1/64.
struct WalkVocabulary {
  WalkVocabulary(std::vector<std::string> t, size_t fraction)
      : tokens(std::move(t)), table(tokens), costly_fraction(fraction) {}
  const std::vector<std::string> tokens;
  const grammar::TokenTable table;
  grammar::SharedMaskEntries shared;
  const size_t costly_fraction;
};

// Up to `max_steps` tokens: at each step the first token the mask allows at or after an
// input-chosen one (`data`, cycled, times `stride`). A token the mask allowed and the matcher then
// refused aborts: the fuzzer's finding (an ambiguous grammar may overflow the parse stacks; the
// mask must leave such tokens out). So does a mask from a prepared cache sharing costly walks
// with earlier inputs' grammars that differs from the grammar's own.
inline void WalkAllowedTokens(grammar::GrammarMatcher& m, WalkVocabulary& v, const uint8_t* data,
                              size_t size, size_t max_steps, size_t stride) {
  grammar::TokenMasker masker(v.table, {.shared = &v.shared, .costly_fraction = v.costly_fraction});
  grammar::TokenMasker own_masker(v.table);
  grammar::MaskCache cache, own;
  masker.Prepare(m.grammar(), &cache,
                 std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  std::vector<uint32_t> mask, own_mask;
  const size_t vocab = v.tokens.size();
  for (size_t step = 0; step < max_steps && size > 0; ++step) {
    const int64_t allowed = masker.Compute(m, &cache, &mask);
    if (own_masker.Compute(m, &own, &own_mask) != allowed || own_mask != mask) std::abort();
    if (allowed == 0) break;
    const size_t start = data[step % size] * stride % vocab;
    for (size_t k = 0; k < vocab; ++k) {
      const size_t id = (start + k) % vocab;
      if (!grammar::MaskAllows(mask, static_cast<int64_t>(id))) continue;
      if (!m.Advance(v.tokens[id])) std::abort();
      break;
    }
  }
}

// The EBNF and regex fuzzers' walk: 24 tokens over WalkTokens (268: costly at 1/8).
inline void WalkAllowedTokens(grammar::GrammarMatcher& m, const uint8_t* data, size_t size) {
  static WalkVocabulary* const kVocabulary = new WalkVocabulary(WalkTokens(), 8);
  WalkAllowedTokens(m, *kVocabulary, data, size, /*max_steps=*/24, /*stride=*/7);
}

}  // namespace specula::fuzz
