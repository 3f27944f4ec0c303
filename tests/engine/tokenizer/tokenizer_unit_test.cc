// Small cases with hand-written tokenizer.json files: errors, and a tiny byte-level tokenizer
// structured like the project's tiny model (and Llama 3).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer_internal::ByteToUnicode;

constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Ids 0..255 are the 256 byte-level characters (so ASCII letters have their byte value as id),
// then merges, then the special tokens.
json TinyByteLevel() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToUnicode(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"1", "2"}};
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(json::array({a, b}));
  }
  json added = json::array();
  for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"}) {
    added.push_back({{"id", next++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", kLlama3Pattern}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens",
         {{"<|begin_of_text|>",
           {{"id", "<|begin_of_text|>"}, {"ids", {262}}, {"tokens", {"<|begin_of_text|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

TEST(TinyByteLevel, EncodesDecodesAndStreams) {
  const json config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<|begin_of_text|>"}}},
                       {"eos_token", "<|eot_id|>"},
                       {"chat_template", "{{ messages }}"}};
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), config.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 265);
  EXPECT_EQ(t.bos_token_id(), 262);
  EXPECT_EQ(t.eos_token_id(), 264);
  EXPECT_EQ(t.chat_template(), "{{ messages }}");

  auto ids = t.Encode("hello world<|eot_id|>", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // "hello" fully merged; " world" -> "Ġw" + o r l d; the special token split out before BPE.
  EXPECT_THAT(*ids, ElementsAre(262, 259, 260, 'o', 'r', 'l', 'd', 264));
  EXPECT_EQ(*t.Decode(*ids, false), "<|begin_of_text|>hello world<|eot_id|>");
  EXPECT_EQ(*t.Decode(*ids, true), "hello world");

  // Digits are pre-tokenized in runs of at most three: "1234" -> "123" "4"; "12" merges.
  ids = t.Encode("1234", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAre(261, '3', '4'));

  // Multi-byte characters go through the byte alphabet and come back intact, also streamed.
  const std::string text = "héllo 🙂\n\n";
  ids = t.Encode(text, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*t.Decode(*ids, false), text);
  StreamingDetokenizer detok(t, false);
  std::string streamed;
  for (TokenId id : *ids) streamed += detok.Push(id);
  streamed += detok.Finish();
  EXPECT_EQ(streamed, text);

  // An unfinished character at the end comes out as one U+FFFD from Finish().
  StreamingDetokenizer partial(t, false);
  EXPECT_EQ(partial.Push('a'), "a");
  EXPECT_EQ(partial.Push(0xF0), "");
  EXPECT_EQ(partial.Push(0x9F), "");
  EXPECT_EQ(partial.Finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(*t.Decode(std::vector<TokenId>{'a', 0xF0, 0x9F}, false), "a\xEF\xBF\xBD");
}

TEST(TinyByteLevel, StringMergesAndIgnoreMerges) {
  json j = TinyByteLevel();
  json merges = json::array();
  for (const auto& m : j["model"]["merges"]) {
    merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  j["model"]["merges"] = merges;
  auto tok = Tokenizer::FromJson(j.dump(), "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("hello", false), ElementsAre(259));
  EXPECT_EQ((*tok)->bos_token_id(), 262);  // from the template when there is no config
  EXPECT_EQ((*tok)->eos_token_id(), std::nullopt);

  // With ignore_merges a pre-token that is itself in the vocabulary is emitted whole, even where
  // the merges would not produce it ("hel" + "lo" has no merge path to "hello" here).
  j["model"]["merges"] = json::array({"h e", "l o"});
  for (const char* gone : {"ll", "hell", "hello"}) j["model"]["vocab"].erase(gone);
  j["model"]["vocab"]["hello"] = 257;
  j["model"]["vocab"]["lo"] = 258;
  j["model"]["ignore_merges"] = true;
  tok = Tokenizer::FromJson(j.dump(), "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("hello", false), ElementsAre(257));
  j["model"]["ignore_merges"] = false;
  tok = Tokenizer::FromJson(j.dump(), "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("hello", false), ElementsAre(256, 'l', 258));
}

TEST(TinyByteLevel, SplitBehaviours) {
  json j = TinyByteLevel();
  j["model"]["vocab"]["a-"] = 265;
  j["model"]["vocab"]["-b"] = 266;
  j["model"]["merges"].push_back(json::array({"a", "-"}));
  j["model"]["merges"].push_back(json::array({"-", "b"}));
  struct Case {
    const char* behavior;
    bool invert;
    std::vector<TokenId> ids;
  };
  const std::vector<Case> cases = {
      {"Isolated", false, {'a', '-', 'b'}},      {"Removed", false, {'a', 'b'}},
      {"MergedWithPrevious", false, {265, 'b'}}, {"MergedWithNext", false, {'a', 266}},
      {"Contiguous", false, {'a', '-', 'b'}},    {"Removed", true, {'-'}},
  };
  for (const Case& c : cases) {
    j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"},
                                              {"pattern", {{"String", "-"}}},
                                              {"behavior", c.behavior},
                                              {"invert", c.invert}};
    auto tok = Tokenizer::FromJson(j.dump(), "");
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto ids = (*tok)->Encode("a-b", false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c.ids) << c.behavior << " invert=" << c.invert;
  }
}

TEST(TokenizerErrors, MalformedJson) {
  auto tok = Tokenizer::FromJson("{\"model\": ", "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("tokenizer.json"));

  tok = Tokenizer::FromJson(TinyByteLevel().dump(), "[1, 2");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("tokenizer_config.json"));

  json j = TinyByteLevel();
  j["model"]["vocab"] = "not an object";
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);

  j = TinyByteLevel();
  j["model"]["merges"].push_back(json::array({"x", "y"}));  // "xy" is not in the vocabulary
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("x y"));

  j = TinyByteLevel();
  j["added_tokens"][0]["id"] = "zero";  // wrong type: nlohmann's exception must not escape
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);

  tok = Tokenizer::FromJson(TinyByteLevel().dump(), R"({"eos_token": "<|nope|>"})");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("<|nope|>"));
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  json j = TinyByteLevel();
  j["model"]["type"] = "WordPiece";
  auto tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("WordPiece"));

  j = TinyByteLevel();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "BertPreTokenizer"}};
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("BertPreTokenizer"));

  j = TinyByteLevel();
  j["normalizer"] = {{"type", "Precompiled"}};
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_THAT(Msg(tok.status()), HasSubstr("Precompiled"));

  j = TinyByteLevel();
  j["decoder"] = {{"type", "WordPiece"}};
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_THAT(Msg(tok.status()), HasSubstr("decoder type \"WordPiece\""));

  j = TinyByteLevel();
  j["post_processor"] = {{"type", "BertProcessing"}};
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_THAT(Msg(tok.status()), HasSubstr("BertProcessing"));

  j = TinyByteLevel();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("(unclosed"));
}

TEST(TokenizerErrors, BadIdsAndInvalidUtf8) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  auto text = (*tok)->Decode(std::vector<TokenId>{'a', 265}, false);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(text.status()), HasSubstr("265"));
  EXPECT_EQ((*tok)->Decode(std::vector<TokenId>{-3}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ids = (*tok)->Encode("ok \xC0\xAF", false);  // overlong encoding of '/'
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(ids.status()), HasSubstr("offset 3"));
}

// Two vocabulary tokens under one id: that id would decode as either of them.
TEST(TokenizerErrors, VocabTokensSharingAnIdAreALoadError) {
  json j = TinyByteLevel();
  j["model"]["vocab"]["zz-dup"] = j["model"]["vocab"]["a"];
  auto tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()),
              HasSubstr(absl::StrCat("vocab tokens \"a\" and \"zz-dup\" share id ",
                                     j["model"]["vocab"]["a"].get<int>())));
}

TEST(TokenizerErrors, IdsBeyondTheVocabularyAreLoadErrorsNamingTheToken) {
  // An id of 2^30 once sized a table of 2^30 strings (std::bad_alloc).
  json j = TinyByteLevel();
  j["model"]["vocab"]["huge"] = 1 << 30;
  auto tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("tokenizer.json: token \"huge\" has id 1073741824, "
                                           "outside the vocabulary [0, 4194304)"));

  j = TinyByteLevel();
  j["added_tokens"][1]["id"] = 1 << 30;
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("added token \"<|end_of_text|>\" has id 1073741824"));

  // Not truncated to 32 bits first (it would become id 7), nor rounded.
  j = TinyByteLevel();
  j["added_tokens"][1]["id"] = (int64_t{1} << 32) + 7;
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_THAT(Msg(tok.status()), HasSubstr("has id 4294967303, outside the vocabulary"));
  j["added_tokens"][1]["id"] = 1.5;
  tok = Tokenizer::FromJson(j.dump(), "");
  EXPECT_THAT(Msg(tok.status()), HasSubstr("not an integer"));

  // The model's vocabulary is the bound when there is a model: ids 0..264 need 265 ids.
  EXPECT_TRUE(Tokenizer::FromJson(TinyByteLevel().dump(), "", 265).ok());
  tok = Tokenizer::FromJson(TinyByteLevel().dump(), "", 264);
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("\"<|eot_id|>\" has id 264, outside the vocabulary "
                                           "[0, 264)"));
  tok = Tokenizer::FromJson(TinyByteLevel().dump(), "", 200);
  EXPECT_THAT(Msg(tok.status()), HasSubstr("has id 2"));  // a base vocabulary id (200..260)
}

TEST(TinyByteLevel, EncodingStopsPastMaxTokens) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  // "hello world 12" is hello, Ġw, o, r, l, d, Ġ, 12: 8 ids (9 with <|begin_of_text|>).
  auto all = (*tok)->Encode("hello world 12", true);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 9u);
  EncodeOptions limited;
  limited.max_tokens = 9;
  auto exact = (*tok)->Encode("hello world 12", limited);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(*exact, *all);
  limited.max_tokens = 8;
  auto over = (*tok)->Encode("hello world 12", limited);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Msg(over.status()), HasSubstr("more than 8 tokens"));
  // Added tokens count too, and a long text stops early with the same answer.
  limited.add_special_tokens = false;
  limited.max_tokens = 2;
  EXPECT_EQ((*tok)->Encode("<|eot_id|><|eot_id|><|eot_id|>", limited).status().code(),
            absl::StatusCode::kOutOfRange);
  // One piece of a million letters: refused by its length before BPE runs over it.
  const std::string long_text(1 << 20, 'x');
  limited.max_tokens = 100;
  EXPECT_EQ((*tok)->Encode(long_text, limited).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(TinyByteLevel, NoSecondBosForATextThatStartsWithIt) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  const TokenId bos = *(*tok)->bos_token_id();
  EncodeOptions single;
  single.single_bos = true;
  auto plain = (*tok)->Encode("hello", single);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->front(), bos);  // the post-processor adds it
  EXPECT_EQ(*(*tok)->Encode("<|begin_of_text|>hello", single), *plain);
  // By default Hugging Face's behaviour: a second BOS.
  EXPECT_EQ((*tok)->Encode("<|begin_of_text|>hello", true)->size(), plain->size() + 1);
  // Two in the text stay two (only the added one is dropped); none is added without special
  // tokens.
  auto two = (*tok)->Encode("<|begin_of_text|><|begin_of_text|>hello", single);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), plain->size() + 1);
  EXPECT_EQ(*(*tok)->Encode("<|begin_of_text|>hello", false), *plain);
}

TEST(TinyByteLevel, SplitSpecialTokensKeepsControlTokenTextAsText) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  const std::string text = "user says <|eot_id|> hi";
  const TokenId eot = *(*tok)->TokenToId("<|eot_id|>");
  auto parsed = (*tok)->Encode(text, false);
  ASSERT_TRUE(parsed.ok());
  EXPECT_THAT(*parsed, ::testing::Contains(eot));  // the default: special tokens are parsed
  EncodeOptions literal;
  literal.add_special_tokens = false;
  literal.split_special_tokens = true;
  auto split = (*tok)->Encode(text, literal);
  ASSERT_TRUE(split.ok());
  EXPECT_THAT(*split, ::testing::Not(::testing::Contains(eot)));
  EXPECT_EQ(*(*tok)->Decode(*split, false), text);  // byte for byte the same text
}

// Plain ranges: a special token overlapping one is text; the same token elsewhere stays special.
TEST(TinyByteLevel, PlainRangesKeepTheirControlTokenTextAsText) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  const TokenId eot = *(*tok)->TokenToId("<|eot_id|>");
  const std::string text = "<|eot_id|>a<|eot_id|>b<|eot_id|>";  // at 0, 11 and 22
  EncodeOptions options;
  options.add_special_tokens = false;
  auto count = [&](std::vector<std::pair<size_t, size_t>> ranges) {
    options.plain_ranges = std::move(ranges);
    auto ids = (*tok)->Encode(text, options);
    EXPECT_TRUE(ids.ok());
    EXPECT_EQ(*(*tok)->Decode(*ids, false), text);
    return std::count(ids->begin(), ids->end(), eot);
  };
  EXPECT_EQ(count({}), 3);
  EXPECT_EQ(count({{11, 21}}), 2);            // exactly the middle one
  EXPECT_EQ(count({{10, 12}}), 2);            // overlapping its start
  EXPECT_EQ(count({{20, 23}}), 1);            // overlapping the end of one, the start of the next
  EXPECT_EQ(count({{10, 11}, {21, 22}}), 3);  // touching, not overlapping
}

TEST(TinyByteLevel, MaxBytesPerTokenOnlyWhereCertain) {
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), "");
  ASSERT_TRUE(tok.ok());
  // The longest piece is the added "<|begin_of_text|>" (17 bytes).
  EXPECT_EQ((*tok)->max_bytes_per_token(), 17);

  json j = TinyByteLevel();
  j["normalizer"] = {{"type", "NFC"}};  // composition shortens text
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j = TinyByteLevel();
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "  "}}}, {"content", " "}};
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), 17);
  j = TinyByteLevel();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";  // drops what it matches
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j = TinyByteLevel();
  j["added_tokens"][2]["lstrip"] = true;  // absorbs any run of spaces before it
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j = TinyByteLevel();
  j["model"]["vocab"].erase(ByteToUnicode(1));  // byte 1 is then dropped (no unk token)
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
  j["model"]["vocab"]["<unk>"] = 1;
  j["model"]["unk_token"] = "<unk>";  // one unk per unknown character
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), 17);
  j["model"]["fuse_unk"] = true;  // a run of them is one unk
  EXPECT_EQ((*Tokenizer::FromJson(j.dump(), ""))->max_bytes_per_token(), std::nullopt);
}

TEST(TokenizerSplit, BehavioursOnATinySentencePieceStyleModel) {
  // Metaspace pre-tokenizer (prepend_scheme "first", split), byte fallback, Metaspace decoder.
  json vocab = {{"<unk>", 0},
                {"\xE2\x96\x81", 1},
                {"a", 2},
                {"b", 3},
                {"\xE2\x96\x81"
                 "a",
                 4}};
  int next = 5;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = next++;
  }
  const json j = {
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 261},
                                     {"content", "<X>"},
                                     {"special", true},
                                     {"lstrip", true},
                                     {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "\xE2\x96\x81"},
        {"prepend_scheme", "first"},
        {"split", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "ByteFallback"}},
                                  {{"type", "Metaspace"},
                                   {"replacement", "\xE2\x96\x81"},
                                   {"prepend_scheme", "first"},
                                   {"split", true}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", json::array({"\xE2\x96\x81 a"})}}}};
  const json config = {{"bos_token", "<unk>"}, {"add_bos_token", true}, {"add_eos_token", false}};
  auto tok = Tokenizer::FromJson(j.dump(), config.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  // "a b" -> "▁a" "▁b"; "é" falls back to its two bytes; lstrip/rstrip eat the spaces around <X>
  // and the text after it is not at offset 0, so it gets no "▁" (prepend_scheme first).
  auto ids = t.Encode("a bé  <X>  ab", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(0, 4, 1, 3, 5 + 0xC3, 5 + 0xA9, 261, 2, 3));
  EXPECT_EQ(*t.Decode(*ids, true), "a béab");
  // The decoder's leading-space strip only applies when the text starts with a space.
  EXPECT_EQ(*t.Decode(*ids, false), "<unk> a bé<X>ab");
}

// A model directory with the tiny byte-level tokenizer and the given files.
std::filesystem::path ModelDirWith(const std::string& name,
                                   const std::vector<std::pair<std::string, std::string>>& files,
                                   const json& config) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "additional_chat_templates");
  std::ofstream(dir / "tokenizer.json") << TinyByteLevel().dump();
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  for (const auto& [file, text] : files) std::ofstream(dir / file) << text;
  return dir;
}

// transformers 5 saves templates to chat_template.jinja and additional_chat_templates/; when
// present they replace tokenizer_config.json's (from_pretrained: "If independent chat template
// file(s) exist, they take priority over template entries in the tokenizer config").
TEST(ChatTemplateFiles, TemplateFilesReplaceTheConfigTemplate) {
  const json config = {{"chat_template", "old {{ messages }}"}};
  auto tok = Tokenizer::FromDirectory(
      ModelDirWith("tpl_files",
                   {{"chat_template.jinja", "new {{ messages }}"},
                    {"additional_chat_templates/tool_use.jinja", "tools {{ tools }}"}},
                   config)
          .string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_template(), "new {{ messages }}");
  const ChatTemplates& t = (*tok)->chat_templates();
  EXPECT_EQ(*t.Pick(/*with_tools=*/true), "tools {{ tools }}");
  EXPECT_EQ(*t.Pick(/*with_tools=*/false), "new {{ messages }}");
  EXPECT_THAT(t.origin, HasSubstr("chat_template.jinja"));
  EXPECT_THAT(t.origin, HasSubstr("additional_chat_templates"));
}

TEST(ChatTemplateFiles, ConfigTemplateWhenNoFiles) {
  auto tok = Tokenizer::FromDirectory(
      ModelDirWith("tpl_config", {}, {{"chat_template", "old {{ messages }}"}}).string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_template(), "old {{ messages }}");
  EXPECT_THAT((*tok)->chat_templates().origin, HasSubstr("tokenizer_config.json"));
}

TEST(ChatTemplateFiles, NamedTemplatesPickToolUseOnlyWithTools) {
  const json config = {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D"}},
                                                      {{"name", "rag"}, {"template", "R"}}})}};
  auto tok = Tokenizer::FromJson(TinyByteLevel().dump(), config.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const ChatTemplates& t = (*tok)->chat_templates();
  EXPECT_EQ(*t.Pick(true), "T");
  EXPECT_EQ(*t.Pick(false), "D");
  EXPECT_EQ(t.by_name.size(), 3u);
  // No default: transformers refuses to guess; so does specula (without tools).
  const json no_default = {
      {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}}})}};
  tok = Tokenizer::FromJson(TinyByteLevel().dump(), no_default.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_templates().Pick(false), nullptr);
  EXPECT_EQ((*tok)->chat_template(), "");
  const json bad = {{"chat_template", json::array({{{"name", 3}, {"template", "T"}}})}};
  EXPECT_THAT(Msg(Tokenizer::FromJson(TinyByteLevel().dump(), bad.dump()).status()),
              HasSubstr("chat_template"));
}

TEST(ChatTemplateFiles, OnlyNamedFilesStillReplaceTheConfigTemplate) {
  auto tok = Tokenizer::FromDirectory(
      ModelDirWith("tpl_named", {{"additional_chat_templates/tool_use.jinja", "T"}},
                   {{"chat_template", "old"}})
          .string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->chat_template(), "");
  EXPECT_EQ(*(*tok)->chat_templates().Pick(true), "T");
}

TEST(ChatTemplateFiles, UnreadableTemplateFilesAreErrorsNamingThem) {
  const std::filesystem::path dir = ModelDirWith("tpl_bad", {}, json::object());
  std::filesystem::create_directories(dir / "chat_template.jinja");  // a directory, not a file
  auto tok = Tokenizer::FromDirectory(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(Msg(tok.status()), HasSubstr("chat_template.jinja' is a directory"));
  std::filesystem::remove_all(dir / "chat_template.jinja");
  std::ofstream(dir / "chat_template.jinja") << std::string(kMaxChatTemplateFileBytes + 1, 'x');
  tok = Tokenizer::FromDirectory(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(Msg(tok.status()), HasSubstr("more than the limit of 1048576"));
  std::filesystem::remove(dir / "chat_template.jinja");
  std::filesystem::create_symlink("/dev/zero", dir / "chat_template.jinja");
  tok = Tokenizer::FromDirectory(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(Msg(tok.status()), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace specula
