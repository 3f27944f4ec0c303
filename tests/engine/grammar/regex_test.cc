// Regular expressions as grammars (engine/grammar/regex.h): the UTF-8 ranges under the character
// classes, agreement with an independent ECMAScript engine (std::regex) on every short string,
// JSON-string escaping for `pattern`, and what is refused.
#include "engine/grammar/regex.h"

#include <regex>
#include <string>
#include <vector>

#include "engine/grammar/code_points.h"
#include "engine/grammar/json_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;
using ::specula::grammar::testing::AllStrings;
using ::testing::HasSubstr;

RegexOptions Options(RegexText text, RegexMatch match) {
  RegexOptions o;
  o.text = text;
  o.match = match;
  return o;
}

bool SequenceMatches(const Utf8Sequence& seq, const std::string& bytes) {
  if (seq.size() != bytes.size()) return false;
  for (size_t i = 0; i < seq.size(); ++i) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b < seq[i].first || b > seq[i].second) return false;
  }
  return true;
}

// Every scalar value's encoding is matched by exactly one sequence of its range, and the
// sequences of a range match no encoding outside it.
TEST(CodePointsTest, Utf8SequencesCoverExactlyTheirRange) {
  for (const auto& [lo, hi] :
       std::vector<std::pair<uint32_t, uint32_t>>{{0, kMaxCodePoint},
                                                  {0x41, 0x5A},
                                                  {0x7F, 0x80},
                                                  {0x7FF, 0x800},
                                                  {0x3A9, 0x1F600},
                                                  {0xD000, 0xE100},
                                                  {0xFFFF, 0x10000},
                                                  {0x10FFF0, kMaxCodePoint}}) {
    const std::vector<Utf8Sequence> seqs = Utf8Sequences(lo, hi);
    ASSERT_FALSE(seqs.empty());
    const uint32_t from = lo > 0x300 ? lo - 0x300 : 0;
    const uint32_t to = std::min<uint32_t>(hi + 0x300, kMaxCodePoint);
    for (uint32_t c = from; c <= to; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      const std::string e = EncodeUtf8(c);
      int matches = 0;
      for (const Utf8Sequence& s : seqs) matches += SequenceMatches(s, e);
      ASSERT_EQ(matches, (c >= lo && c <= hi) ? 1 : 0)
          << std::hex << c << " in " << lo << "-" << hi;
    }
  }
  // Surrogates (ED A0..BF xx) are never produced.
  for (const Utf8Sequence& s : Utf8Sequences(0xD000, 0xE000)) {
    EXPECT_FALSE(SequenceMatches(s, "\xED\xA0\x80"));
    EXPECT_FALSE(SequenceMatches(s, "\xED\xBF\xBF"));
  }
}

TEST(CodePointsTest, SetAlgebra) {
  CodePointSet s = CodePointSet::Of('a', 'f');
  s.Add('g', 'k');  // adjacent: merged
  s.Add('x', 'z');
  EXPECT_EQ(s.ranges().size(), 2u);
  EXPECT_EQ(s.Minus(CodePointSet::Of('c', 'y')).ranges(),
            (std::vector<std::pair<uint32_t, uint32_t>>{{'a', 'b'}, {'z', 'z'}}));
  EXPECT_EQ(s.Intersect(CodePointSet::Of('j', 'y')).ranges(),
            (std::vector<std::pair<uint32_t, uint32_t>>{{'j', 'k'}, {'x', 'y'}}));
  EXPECT_TRUE(s.Complement().Contains('A'));
  EXPECT_FALSE(s.Complement().Contains('b'));
  EXPECT_FALSE(CodePointSet::All().Contains(0xDC00));
}

// The grammar accepts exactly what std::regex (ECMAScript) matches, on every string of up to
// four characters over a small alphabet: as a whole (regex_match) and as a search.
TEST(RegexTest, AgreesWithStdRegexOnEveryShortString) {
  const std::vector<std::string> patterns = {"a",
                                             "ab|c",
                                             "a*",
                                             "a+b?",
                                             "(ab)*c",
                                             "[a-c]{2,3}",
                                             "[^a]b",
                                             "(a|b)*abb",
                                             "a{2}",
                                             "a{2,}",
                                             "a{0,2}b{1,2}",
                                             "(a?)*b",
                                             "(a*)*",
                                             "(a*b*)+c?",
                                             "(?:ab|a)(?:bc|c)",
                                             "\\x61\\u0062",
                                             "[\\da]+",
                                             "\\w{3}",
                                             "(a|)+b",
                                             "a*?b",
                                             "(a{0,1}){2,3}",
                                             ".c",
                                             "[-a]b",
                                             "[a\\-c]+",
                                             "\\d|\\s",
                                             "(|a)(|b)(|c)",
                                             "((a|b)(c|a)?)+",
                                             "a{1}b{0}c",
                                             "[^\\w]"};
  const std::vector<std::string> texts = AllStrings("abc1 -", 4);
  for (const std::string& p : patterns) {
    SCOPED_TRACE(p);
    auto whole = CompileRegex(p, Options(RegexText::kRaw, RegexMatch::kWhole));
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto search = CompileRegex(p, Options(RegexText::kRaw, RegexMatch::kSearch));
    ASSERT_TRUE(search.ok()) << search.status();
    const std::regex reference(p, std::regex::ECMAScript);
    for (const std::string& t : texts) {
      ASSERT_EQ(Accepts(*whole, t), std::regex_match(t, reference)) << "whole: '" << t << "'";
      ASSERT_EQ(Accepts(*search, t), std::regex_search(t, reference)) << "search: '" << t << "'";
    }
  }
}

TEST(RegexTest, AnchorsLimitTheSearch) {
  const RegexOptions search = Options(RegexText::kRaw, RegexMatch::kSearch);
  auto starts = CompileRegex("^ab|c$", search);
  ASSERT_TRUE(starts.ok()) << starts.status();
  EXPECT_TRUE(Accepts(*starts, "abxx"));
  EXPECT_FALSE(Accepts(*starts, "xab"));
  EXPECT_TRUE(Accepts(*starts, "xxc"));
  EXPECT_FALSE(Accepts(*starts, "cx"));
  // Whole-text matching takes the anchors as given.
  auto whole = CompileRegex("^ab$", Options(RegexText::kRaw, RegexMatch::kWhole));
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(Accepts(*whole, "ab"));
  EXPECT_FALSE(Accepts(*whole, "abab"));
}

TEST(RegexTest, ClassesAndEscapesCoverUnicode) {
  const RegexOptions whole = Options(RegexText::kRaw, RegexMatch::kWhole);
  auto g = CompileRegex("[^a]", whole);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Accepts(*g, "é"));
  EXPECT_TRUE(Accepts(*g, "\xF0\x9F\x98\x80"));  // U+1F600
  EXPECT_FALSE(Accepts(*g, "a"));
  EXPECT_FALSE(Accepts(*g, "\xED\xA0\x80"));  // a surrogate's encoding is not UTF-8
  EXPECT_FALSE(Accepts(*g, "\xC3"));          // half a character
  g = CompileRegex("\\u{1F600}\\uD83D\\uDE00[α-ω]+", whole);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "\xF0\x9F\x98\x80\xF0\x9F\x98\x80λμ"));
  EXPECT_FALSE(Accepts(*g,
                       "\xF0\x9F\x98\x80\xF0\x9F\x98\x80"
                       "A"));
  g = CompileRegex("(?<year>\\d{4})-(?:\\d\\d)", whole);  // a group's name changes nothing
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "2026-11"));
  g = CompileRegex(".", whole);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Accepts(*g, "\t"));
  EXPECT_FALSE(Accepts(*g, "\n"));
  EXPECT_FALSE(Accepts(*g, "\xE2\x80\xA8"));  // U+2028, a line terminator
  g = CompileRegex("\\s", whole);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Accepts(*g, "\xE3\x80\x80"));  // U+3000 ideographic space
}

// Inside a JSON string the pattern is over the decoded value: what JSON escapes is written
// escaped, and the quotes around it are the schema compiler's.
TEST(RegexTest, PatternInAJsonSchemaMatchesTheDecodedString) {
  auto g = CompileJsonSchema(nlohmann::ordered_json::parse(R"({"type": "string",
      "pattern": "^[A-Z]{3}-\\d{2}$"})"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, R"("ABC-12")"));
  EXPECT_FALSE(Accepts(*g, R"("ABCD-12")"));
  EXPECT_FALSE(Accepts(*g, R"("abc-12")"));
  g = CompileJsonSchema(nlohmann::ordered_json::parse(R"({"type": "string", "pattern": "b"})"));
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Accepts(*g, R"("abc")"));  // unanchored: somewhere in the string
  EXPECT_FALSE(Accepts(*g, R"("ac")"));
  g = CompileJsonSchema(
      nlohmann::ordered_json::parse(R"({"type": "string", "pattern": "^[\"\\\\\\n]+$"})"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, R"("\"\\\n")"));
  EXPECT_FALSE(Accepts(*g, "\"\n\""));  // a raw line break is not JSON
  EXPECT_TRUE(Accepts(*g, R"("\"\"")"));
  EXPECT_FALSE(Accepts(*g, R"("\""")"));  // an unescaped quote ends the string
  g = CompileJsonSchema(nlohmann::ordered_json::parse(R"({"type": "string", "pattern": "x",
      "maxLength": 3})"));
  EXPECT_THAT(g.status().message(), HasSubstr("pattern together with minLength"));
}

TEST(RegexTest, RefusesWhatItCannotHonourByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(a)\\1", "backreferences"},
      {"a(?=b)", "lookahead"},
      {"(?<!a)b", "lookahead and lookbehind"},
      {"\\bword", "word boundaries"},
      {"\\p{L}", "Unicode property escapes"},
      {"a^b", "^ other than at the start"},
      {"(a$)", "$ other than at the end"},
      {"a{1001}", "repetition bound over 1000"},
      {"a{3,2}", "n > m"},
      {"*a", "nothing to repeat"},
      {"a**", "nothing to repeat"},
      {"(ab", "missing )"},
      {"ab)", "unmatched )"},
      {"[ab", "missing ]"},
      {"[z-a]", "out of order"},
      {"[\\d-z]", "class escape"},
      {"\\q", "unknown escape"},
      // The "u" flag's syntax, as ajv reads patterns: no lone braces, no identity escapes of
      // ordinary characters, group names that are names.
      {"a{,3}", "a lone {"},
      {"a}", "a lone }"},
      {"a]", "a lone ]"},
      {"\\_", "unknown escape \\_"},
      {"\\-", "unknown escape \\-"},
      {"\\\xC3\xA9", "an escaped non-ASCII character"},
      {"(?<a)b>c)", "a malformed group name"},
      {"(?<1a>c)", "a malformed group name"},
      // Nested repetitions of what can be empty: refused, not followed at a cost per byte.
      {"(?:(?:a?){1000}){1000}c", "may nest more than 2048 rules"},
      {"\\uD800", "lone surrogate"},
      {"[^\\s\\S]", "no character satisfies"},
      {"\xC3", "invalid UTF-8"},
      {std::string(70, '(') + std::string(70, ')'), "nested deeper than 64"},
  };
  for (const auto& [pattern, message] : cases) {
    auto g = CompileRegex(pattern);
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_THAT(g.status().message(), HasSubstr(message)) << pattern;
  }
  // A pattern's grammar over the symbol budget is refused, not built.
  EXPECT_THAT(CompileRegex("(a{1000}){1000}[b-z]{1000}", {}, 2000).status().message(),
              HasSubstr("symbols"));
  // Nested stars of what can be empty compile in time linear in the nesting.
  std::string nested = "a*";
  for (int i = 0; i < 60; ++i) nested = "(?:" + nested + ")*";
  auto g = CompileRegex(nested);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "aaa"));
}

}  // namespace
}  // namespace specula::grammar
