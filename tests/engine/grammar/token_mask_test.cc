// TokenMasker against the plain definition: a token is allowed when a copy of the matcher takes
// all of its bytes. Checked at every step of random walks through JSON objects, over a
// vocabulary with shared prefixes, multi-byte characters and tokens no grammar allows.
#include "engine/grammar/token_mask.h"

#include <random>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "gtest/gtest.h"

namespace specula::grammar {
namespace {

std::vector<std::string> TestVocabulary() {
  std::vector<std::string> vocab{"", ""};  // two special tokens: never allowed
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"",     "\":",      "\": ", "\",",    "\"}",  "}",        "{}",  "[]",    "true",
        "false",   "null",     "nul",  "12",     "-0",   "0.5",      "e+",  "\\n",   "\\u00e9",
        "\\ud800", "\xC3\xA9", "\xC3", "\xA9\"", "name", "\"name\"", " \"", ",\n  ", "\n",
        "  ",      "    ",     "}}",   "]}",     "\"}}", "ab\"",     "a\"b"}) {
    vocab.push_back(t);
  }
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":, \nab01-.e\\tu";
  for (int i = 0; i < 400; ++i) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int j = 0; j < len; ++j) t += alphabet[rng() % alphabet.size()];
    vocab.push_back(t);
  }
  return vocab;
}

std::vector<uint32_t> BruteForceMask(const GrammarMatcher& m,
                                     const std::vector<std::string>& vocab) {
  std::vector<uint32_t> mask((vocab.size() + 31) / 32, 0);
  for (size_t id = 0; id < vocab.size(); ++id) {
    GrammarMatcher copy = m;
    if (!vocab[id].empty() && copy.Advance(vocab[id])) mask[id >> 5] |= uint32_t{1} << (id & 31);
  }
  return mask;
}

TEST(TokenMaskTest, EqualsTryingEveryTokenAlongRandomWalks) {
  const std::vector<std::string> vocab = TestVocabulary();
  const TokenTable table(vocab);
  TokenMasker masker(table);
  auto grammar = AnyJsonObject();
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  std::mt19937 rng(11);
  int checked = 0;
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher m(*grammar);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> mask;
      const int64_t allowed = masker.Compute(m, &mask);
      ASSERT_EQ(mask, BruteForceMask(m, vocab)) << "walk " << walk << " step " << step;
      ++checked;
      if (allowed == 0) break;
      std::vector<size_t> ids;
      for (size_t id = 0; id < vocab.size(); ++id) {
        if (MaskAllows(mask, static_cast<int64_t>(id))) ids.push_back(id);
      }
      ASSERT_EQ(static_cast<int64_t>(ids.size()), allowed);
      ASSERT_TRUE(m.Advance(vocab[ids[rng() % ids.size()]]));
    }
  }
  EXPECT_GE(checked, 200);
}

TEST(TokenMaskTest, SpecialTokensAndRefusedPrefixesAreNeverAllowed) {
  const std::vector<std::string> vocab{"", "{", "{\"", "x", "xy", "xyz", "{}"};
  const TokenTable table(vocab);
  TokenMasker masker(table);
  auto grammar = AnyJsonObject();
  ASSERT_TRUE(grammar.ok());
  GrammarMatcher m(*grammar);
  std::vector<uint32_t> mask;
  EXPECT_EQ(masker.Compute(m, &mask), 3);  // "{", "{\"", "{}"
  EXPECT_FALSE(MaskAllows(mask, 0));
  EXPECT_FALSE(MaskAllows(mask, 3));
  EXPECT_FALSE(MaskAllows(mask, 5));
  EXPECT_TRUE(MaskAllows(mask, 6));
}

}  // namespace
}  // namespace specula::grammar
