// TokenMasker against the plain definition: a token is allowed when a copy of the matcher takes
// all of its bytes. Checked at every step of random walks through JSON objects, over a
// vocabulary with shared prefixes, multi-byte characters and tokens no grammar allows.
#include "engine/grammar/token_mask.h"

#include <random>
#include <string>
#include <vector>

#include "engine/grammar/ebnf.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/grammar/walk_signature.h"
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

// What counts as costly at TestVocabulary's ~700 tokens (TokenMaskerOptions::costly_fraction):
// a string's characters (most tokens), not the escapes and classes beside them.
constexpr size_t kCostlyFraction = 8;

std::vector<uint32_t> BruteForceMask(const GrammarMatcher& m,
                                     const std::vector<std::string>& vocab) {
  std::vector<uint32_t> mask((vocab.size() + 31) / 32, 0);
  for (size_t id = 0; id < vocab.size(); ++id) {
    GrammarMatcher copy = m;
    if (!vocab[id].empty() && copy.Advance(vocab[id])) mask[id >> 5] |= uint32_t{1} << (id & 31);
  }
  return mask;
}

// Random walks through `grammar`, comparing at every step the mask with and without `cache` to
// trying every token. Returns the steps checked.
int CheckWalks(const std::shared_ptr<const Grammar>& grammar, const std::vector<std::string>& vocab,
               MaskCache* cache, uint32_t seed, int threads = 1,
               SharedMaskEntries* shared = nullptr) {
  const TokenTable table(vocab);
  // Costly as at a real vocabulary's 1/64: this one has ~700 tokens.
  TokenMasker masker(table, {.threads = threads,
                             .min_chunk_tokens = 16,
                             .shared = shared,
                             .costly_fraction = kCostlyFraction});
  std::mt19937 rng(seed);
  int checked = 0;
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher m(grammar);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> plain, cached;
      const int64_t allowed = masker.Compute(m, &plain);
      EXPECT_EQ(masker.Compute(m, cache, &cached), allowed);
      const std::vector<uint32_t> expected = BruteForceMask(m, vocab);
      EXPECT_EQ(plain, expected) << "walk " << walk << " step " << step;
      EXPECT_EQ(cached, expected) << "walk " << walk << " step " << step;
      if (::testing::Test::HasFailure()) return checked;
      ++checked;
      if (allowed == 0) break;
      std::vector<size_t> ids;
      for (size_t id = 0; id < vocab.size(); ++id) {
        if (MaskAllows(plain, static_cast<int64_t>(id))) ids.push_back(id);
      }
      EXPECT_EQ(static_cast<int64_t>(ids.size()), allowed);
      EXPECT_TRUE(m.Advance(vocab[ids[rng() % ids.size()]]));
    }
  }
  return checked;
}

// The cache is shared by every walk, as by every step of a request: entries built at one stack
// serve others with the same top frames, whatever lies below.
TEST(TokenMaskTest, EqualsTryingEveryTokenAlongRandomWalks) {
  auto object = AnyJsonObject();
  ASSERT_TRUE(object.ok()) << object.status();
  MaskCache object_cache;
  EXPECT_GE(CheckWalks(*object, TestVocabulary(), &object_cache, 11), 200);
  EXPECT_GT(object_cache.size(), 5u);
  auto schema = CompileJsonSchema(nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"a": {"type": "string", "maxLength": 4},
                     "b": {"type": "array", "items": {"enum": ["ab", "a\"b", 12]}, "maxItems": 3},
                     "c": {"anyOf": [{"type": "null"}, {"type": "object", "properties":
                           {"d": {"type": "string", "minLength": 2}}, "required": ["d"]}]}},
      "required": ["a", "b", "c"]})"));
  ASSERT_TRUE(schema.ok()) << schema.status();
  MaskCache schema_cache;
  EXPECT_GE(CheckWalks(*schema, TestVocabulary(), &schema_cache, 12), 100);
}

// Entries built by several threads, each walking a chunk of the sorted vocabulary (a chunk starts
// afresh, sharing no prefix states with the one before it), equal the single walk's.
TEST(TokenMaskTest, APoolSplittingTheWalkGivesTheSameMasks) {
  auto object = AnyJsonObject();
  ASSERT_TRUE(object.ok()) << object.status();
  MaskCache cache;
  EXPECT_GE(CheckWalks(*object, TestVocabulary(), &cache, 5, /*threads=*/3), 200);
  auto schema = CompileJsonSchema(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 6},
          "n": {"type": "number", "minimum": -2, "exclusiveMaximum": 10.5}},
          "required": ["s", "n"]})"));
  ASSERT_TRUE(schema.ok()) << schema.status();
  MaskCache schema_cache;
  EXPECT_GE(CheckWalks(*schema, TestVocabulary(), &schema_cache, 6, /*threads=*/3), 100);
}

// A token after which a stack's parses overflow (StackSet::kMaxStacks) is refused by the mask,
// with the cache too, which sees only a stack's top frames (it accepted one: the review's find).
// The matcher would follow it, narrowed to the first parses (GrammarMatcher::Advance).
TEST(TokenMaskTest, ATokenThatOverflowsTheStacksIsRefusedWithTheCacheToo) {
  GrammarBuilder b;
  Alternative body;
  std::vector<Alternative> many;
  for (int i = 0; i < 1100; ++i) {  // distinct: Build drops repeated alternatives
    const auto low = static_cast<uint8_t>(32 + i % 90), high = static_cast<uint8_t>(32 + i / 90);
    many.push_back({GrammarBuilder::Bytes(ByteSet::Of("x")),
                    GrammarBuilder::Bytes(ByteSet::Range(low, low)),
                    GrammarBuilder::Bytes(ByteSet::Range(high, high))});
  }
  int32_t inner = b.AddRule("many", std::move(many));
  inner = b.AddRule("paren", {{GrammarBuilder::Bytes(ByteSet::Of("(")), GrammarBuilder::Ref(inner),
                               GrammarBuilder::Bytes(ByteSet::Of(")"))}});
  for (int level = 0; level < 4; ++level) {
    inner = b.AddRule("wrap", {{GrammarBuilder::Bytes(ByteSet::Of("<")), GrammarBuilder::Ref(inner),
                                GrammarBuilder::Bytes(ByteSet::Of(">"))}});
  }
  auto g = b.Build(inner);
  ASSERT_TRUE(g.ok()) << g.status();
  auto grammar = std::make_shared<const Grammar>(*std::move(g));
  const std::vector<std::string> vocab{"<", "(", "(x", "<(", "x"};
  const TokenTable table(vocab);
  TokenMasker masker(table);
  MaskCache cache;
  GrammarMatcher m(grammar);
  ASSERT_TRUE(m.Advance("<<<<"));
  std::vector<uint32_t> plain, cached;
  masker.Compute(m, &plain);
  masker.Compute(m, &cache, &cached);
  EXPECT_EQ(plain, cached);
  EXPECT_FALSE(MaskAllows(cached, 1));  // "(": over 1,024 parses follow it
  EXPECT_FALSE(MaskAllows(cached, 2));  // "(x"
  EXPECT_TRUE(m.Advance("("));          // narrowed, not refused
  EXPECT_EQ(m.stacks().size(), StackSet::kMaxStacks);
}

// Many stacks that each take a token can together exceed StackSet::kMaxStacks: the mask (one
// stack at a time) allows the token, and the matcher follows it on the first parses rather than
// refusing it (which failed the request; fuzz_ebnf's find).
TEST(TokenMaskTest, ATokenManyStacksTakeTogetherIsFollowedNarrowed) {
  auto g = CompileEbnf(R"e(
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= [0-9]+ | "(" expr
  )e");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<std::string> vocab{"(", "0", "+", "1"};
  const TokenTable table(vocab);
  TokenMasker masker(table);
  MaskCache cache;
  GrammarMatcher m(*g);
  // Each open parenthesis is an expression that may end anywhere after a number: the parses
  // multiply with the depth.
  ASSERT_TRUE(m.Advance(std::string(64, '(') + "012+" + std::string(32, '(')));
  std::vector<uint32_t> mask;
  masker.Compute(m, &cache, &mask);
  ASSERT_TRUE(MaskAllows(mask, 1));
  EXPECT_TRUE(m.Advance("0"));
  EXPECT_LE(m.stacks().size(), StackSet::kMaxStacks);
  masker.Compute(m, &cache, &mask);
  EXPECT_TRUE(MaskAllows(mask, 2));  // a "+" still follows
}

// A bounded repetition's keys differ only in the count left (a string's maxLength): one anchor
// is walked and the other counts are derived from it. Every count of a 24-character string, met
// by tokens longer and shorter than what is left (multi-byte characters, escapes, a closing
// quote after text), gives the masks of trying every token, and the vocabulary is walked for
// fewer keys than there are counts.
TEST(TokenMaskTest, EveryCountOfABoundedStringIsDerivedFromOneWalk) {
  auto g =
      CompileJsonSchema(nlohmann::ordered_json::parse(R"({"type": "string", "maxLength": 24})"));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<std::string> vocab = TestVocabulary();
  for (const char* t : {"aaaaaaaaaaaa", "aaaaaaaaaaa\"", "aaaaa", "aa\"", "\\u00e9\\u00e9",
                        "\xC3\xA9\xC3\xA9\xC3\xA9", "a\\n"}) {
    vocab.push_back(t);
  }
  const TokenTable table(vocab);
  TokenMasker masker(table);
  MaskCache cache;
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.Advance("\""));
  for (int left = 24; left >= 0; --left) {
    std::vector<uint32_t> cached;
    masker.Compute(m, &cache, &cached);
    EXPECT_EQ(cached, BruteForceMask(m, vocab)) << left << " characters left";
    if (left > 0) {
      ASSERT_TRUE(m.Advance(left % 3 == 0 ? "\xC3\xA9" : "a"));
    }
  }
  EXPECT_LT(cache.walks(), 24);
}

// Derived counts where the repetition's body has several parses (ambiguous), where a repetition
// is entered again after it ended (inside another one), and with a minimum: random walks compare
// every step's mask with trying every token.
TEST(TokenMaskTest, DerivedCountsFollowAmbiguousAndReenteredRepetitions) {
  std::vector<std::string> vocab = TestVocabulary();
  for (const char* t : {"ab", "aab", "aaa", "abab", "ba", "bab", "aaaaaa", "abe", "ae", "bbbb"}) {
    vocab.push_back(t);
  }
  uint32_t seed = 20;
  for (const char* pattern : {"(ab|a){0,9}b", "(a{0,3}b){1,6}e", "[ab01]{2,15}\"",
                              "(a|ab|b){1,11}(e|t)?", "x?(aa|a){3,10}"}) {
    auto g = CompileRegex(pattern);
    ASSERT_TRUE(g.ok()) << g.status();
    MaskCache cache;
    EXPECT_GE(CheckWalks(*g, vocab, &cache, ++seed), 40) << pattern;
    EXPECT_LT(cache.walks(), static_cast<int64_t>(cache.size())) << pattern;
  }
}

// A string's walks are kept among the shared entries and serve every grammar whose walk from a
// key sees the same rules (WalkSignature), whatever surrounds them: the second schema's string
// is found, not walked. Grammars that differ only where a walk looks (a class one byte wider, a
// shorter bound, a pattern) never take each other's entries: every mask of every grammar, all
// sharing one store, equals trying every token.
TEST(TokenMaskTest, SharedEntriesServeOtherGrammarsExactly) {
  const std::vector<std::string> vocab = TestVocabulary();
  SharedMaskEntries shared;
  uint32_t seed = 40;
  const auto check = [&](const std::shared_ptr<const Grammar>& g, int64_t* hits) {
    MaskCache cache;
    EXPECT_GE(CheckWalks(g, vocab, &cache, ++seed, 1, &shared), 40);
    if (hits != nullptr) *hits = cache.shared_hits();
  };
  std::vector<int64_t> hits;  // per schema
  for (const char* schema :
       {R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})",
        R"({"type": "array", "items": {"type": "object", "properties":
            {"b": {"type": "string"}, "c": {"type": "integer"}}, "required": ["c", "b"]}})",
        R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}},
            "required": ["a"]})",
        R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}},
            "required": ["a"]})",
        R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[ab]*$"}},
            "required": ["a"]})"}) {
    auto g = CompileJsonSchema(nlohmann::ordered_json::parse(schema));
    ASSERT_TRUE(g.ok()) << g.status();
    check(*g, &hits.emplace_back());
    if (::testing::Test::HasFailure()) return;
  }
  // The second schema's string is the first's in another place: found, not walked.
  EXPECT_GT(hits[1], 0);
  // Two grammars alike but for one byte of a class (wide enough for its walks to be shared):
  // the second must not take the first's.
  for (const char* ebnf : {R"e(root ::= "<" item ">"
                             item ::= "\"" [^"\\\x00-\x1f]* "\"")e",
                           R"e(root ::= "<" item ">"
                             item ::= "\"" [^"\\\x00-\x1fu]* "\"")e"}) {
    auto g = CompileEbnf(ebnf);
    ASSERT_TRUE(g.ok()) << g.status();
    const size_t kept = shared.size();
    int64_t found = 0;
    check(*g, &found);
    EXPECT_GT(shared.size(), kept) << ebnf;  // its walks are its own, and kept
    EXPECT_EQ(found, 0) << ebnf;
  }
}

// The signature is the part of the grammar a walk sees: equal for a JSON string wherever it
// stands, different where one byte of what the walk reads differs, and none past the bound.
TEST(TokenMaskTest, AWalksSignatureIsWhatItSees) {
  const auto signature = [](const char* ebnf, std::string_view prefix, size_t max_positions) {
    auto g = CompileEbnf(ebnf);
    EXPECT_TRUE(g.ok()) << g.status();
    GrammarMatcher m(*g);
    EXPECT_TRUE(m.Advance(prefix));
    // The stack whose top takes 'q': inside the quoted class.
    for (size_t s = 0; s < m.stacks().size(); ++s) {
      const int32_t* begin = m.stacks().begin(s);
      const int32_t* end = m.stacks().end(s);
      if (end - begin < 3 || !(*g)->bytes(*(end - 1)).Contains('q')) continue;
      return WalkSignature(**g, absl::MakeConstSpan(end - 3, end), true, nullptr, max_positions);
    }
    ADD_FAILURE() << "no stack inside the class after " << prefix;
    return std::optional<std::string>();
  };
  const char* kObject = R"e(root ::= "{" ws "\"k\":" ws value ws "}"
                            ws ::= " "?
                            value ::= str | "7"
                            str ::= "\"" [a-z]* "\"")e";
  const char* kList = R"e(root ::= "[" (str ",")* str "]"
                          str ::= "\"" [a-z]* "\"")e";
  const char* kWider = R"e(root ::= "[" (str ",")* str "]"
                           str ::= "\"" [a-zA]* "\"")e";
  // What follows the class once the rules of the frames below end: their rest.
  const char* kOtherClose = R"e(root ::= "[" (str ",")* str "]"
                                str ::= "\"" [a-z]* "'")e";
  const auto in_object = signature(kObject, "{\"k\":\"ab", 1000);
  const auto in_list = signature(kList, "[\"ab", 1000);
  const auto wider = signature(kWider, "[\"ab", 1000);
  const auto other_close = signature(kOtherClose, "[\"ab", 1000);
  ASSERT_TRUE(in_object && in_list && wider && other_close);
  EXPECT_EQ(*in_object, *in_list);
  EXPECT_NE(*in_list, *wider);
  EXPECT_NE(*in_list, *other_close);
  EXPECT_FALSE(signature(kList, "[\"ab", 2).has_value());
}

// A prepared cache holds, before the first step, every costly walk the steps would meet: a
// string's characters at each bound (the anchor of a bounded one, each required character),
// in objects, arrays, a whole-stack string and any JSON. Random walks after it find every mask
// exact and walk nothing costly.
TEST(TokenMaskTest, APreparedCacheLeavesNoCostlyWalkToTheSteps) {
  const std::vector<std::string> vocab = TestVocabulary();
  const TokenTable table(vocab);
  TokenMasker masker(table, {.costly_fraction = kCostlyFraction});
  uint32_t seed = 60;
  std::vector<std::shared_ptr<const Grammar>> grammars;
  for (const char* schema :
       {R"({"type": "object", "properties": {"a": {"type": "string"},
            "b": {"type": "string", "minLength": 2, "maxLength": 6},
            "c": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "d": {"type": "object", "properties": {"e": {"type": "string", "minLength": 1}}}},
            "required": ["a", "b", "c"]})",
        R"({"type": "string", "maxLength": 6})", R"({"type": "array", "items": {}})"}) {
    auto g = CompileJsonSchema(nlohmann::ordered_json::parse(schema));
    ASSERT_TRUE(g.ok()) << g.status();
    grammars.push_back(*g);
  }
  auto object = AnyJsonObject();
  ASSERT_TRUE(object.ok());
  grammars.push_back(*object);
  for (const auto& g : grammars) {
    MaskCache cache;
    EXPECT_GT(masker.Prepare(*g, &cache, std::chrono::steady_clock::time_point::max()), 0);
    const int64_t prepared = cache.costly_walks();
    EXPECT_GT(prepared, 0);
    EXPECT_GE(CheckWalks(g, vocab, &cache, ++seed), 40);
    EXPECT_EQ(cache.costly_walks(), prepared) << "seed " << seed;
  }
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
