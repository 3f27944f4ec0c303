// The streaming invariant: for any output and ANY split into chunks, the concatenated deltas
// equal what the whole text gives in one Push; where no syntax applies, content is the input.
// Every example runs under every format, split at every point, byte by byte, and at random.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/chat/output/chat_output_parser.h"
#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula {
namespace {

using chat_output_testing::Bytes;
using chat_output_testing::Collected;
using chat_output_testing::RunChunks;
using chat_output_testing::RunWhole;
using chat_output_testing::SplitAt;

struct Config {
  const char* name;
  ChatOutputFormat format;
  bool tools_enabled;
  bool passthrough;  // no syntax applies: content must equal the input exactly
};

void PrintTo(const Config& config, std::ostream* os) { *os << config.name; }

const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {"none", {}, true, true},
      {"hermes-tools-off", {.tool_calls = ToolCallSyntax::kHermes}, false, true},
      {"llama-tools-off", {.tool_calls = ToolCallSyntax::kLlama3Json}, false, true},
      {"reasoning", {.reasoning = true}, false, false},
      {"starts-in-reasoning", {.reasoning = true, .starts_in_reasoning = true}, false, false},
      {"hermes", {.tool_calls = ToolCallSyntax::kHermes}, true, false},
      {"qwen3", {.tool_calls = ToolCallSyntax::kHermes, .reasoning = true}, true, false},
      {"llama", {.tool_calls = ToolCallSyntax::kLlama3Json}, true, false},
      {"llama-reasoning",
       {.tool_calls = ToolCallSyntax::kLlama3Json, .reasoning = true},
       true,
       false},
  };
  return configs;
}

const std::vector<std::string>& Examples() {
  static const std::vector<std::string> examples = {
      "",
      "Hello, world!",
      "\n\n  Indented answer\n\n",
      "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
      "<think>\n\n</think>\n\nNo thinking.",
      "  <think>a\n\nb</think>c<think>d</think>",
      "<think>\nunterminated\n\n",
      "<think>\nalmost closed\n</thi",
      "reasoning without open tag\n</think>\n\ncontent",
      "<thin",
      "<",
      "Use <think> in content",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>",
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}\n</tool_call>\n",
      "A\n<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"<tool_call>\"}}</tool_call>\nB\n"
      "<tool_call>{\"name\": \"b\"}</tool_call>\nC",
      "<tool_call>\n{broken json}\n</tool_call>\ntext",
      "\n<tool_call>\n{\"name\": \"a\", \"arguments\": "
      "{}}\n</tool_call>\n<tool_call>oops</tool_call>",
      "Hi <tool_call>\n{\"name\": \"cut\", \"argu",
      "ends with <tool_",
      "<tool_call><tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>",
      "</tool_call> stray close tag",
      "<think>\nWeather needed.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"東京\"}}\n</tool_call>",
      "<think>maybe <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call></think>\n\nno",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y}\"}}; {\"name\": \"b\", "
      "\"arguments\": {}};",
      "\n <|python_tag|> \n{\"name\": \"a\", \"parameters\": {}}\n",
      "{not json at all; really}",
      "{\"name\": \"Alice\", \"age\": 30}",
      "<|python_tag|>brave_search.call(query=\"x\")",
      "<|pyth",
      "<think>\nplan\n</think>\n\n{\"name\": \"f\", \"parameters\": {\"n\": 1}}",
      "Voilà 🌍 — 東京\n<tool_call>\n{\"name\": \"say\", \"arguments\": {\"t\": \"ü\"}}\n"
      "</tool_call>\nFertig ✓",
      "<think>\n思考 🤔\n</think>\n\nRéponse ✓",
  };
  return examples;
}

// Cut points at which a chunk may end without breaking a UTF-8 character.
bool IsCharBoundary(std::string_view text, size_t i) {
  return i == text.size() || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xE  ? 3
                       : (c >> 3) == 0x1E ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

void ExpectSame(const Collected& got, const Collected& want, const std::string& how) {
  EXPECT_TRUE(got.SameOutput(want))
      << how << "\n content: [" << got.content << "] vs [" << want.content << "]\n reasoning: ["
      << got.reasoning << "] vs [" << want.reasoning << "]\n calls: " << got.tool_calls.size()
      << " vs " << want.tool_calls.size();
}

class SplitInvarianceTest : public ::testing::TestWithParam<Config> {};

TEST_P(SplitInvarianceTest, EverySinglePointSplit) {
  const Config& config = GetParam();
  for (const std::string& text : Examples()) {
    const Collected whole = RunWhole(config.format, config.tools_enabled, text);
    if (config.passthrough) {
      EXPECT_EQ(whole.content, text);
    }
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      Collected split = RunChunks(config.format, config.tools_enabled, SplitAt(text, {cut}));
      ExpectSame(split, whole, "text [" + text + "] cut at " + std::to_string(cut));
    }
  }
}

TEST_P(SplitInvarianceTest, ByteByByte) {
  const Config& config = GetParam();
  for (const std::string& text : Examples()) {
    ExpectSame(RunChunks(config.format, config.tools_enabled, Bytes(text)),
               RunWhole(config.format, config.tools_enabled, text), "text [" + text + "] bytes");
  }
}

TEST_P(SplitInvarianceTest, RandomMultiSplitsKeepDeltasValidUtf8) {
  const Config& config = GetParam();
  std::mt19937 rng(1234);
  for (const std::string& text : Examples()) {
    const Collected whole = RunWhole(config.format, config.tools_enabled, text);
    for (int round = 0; round < 40; ++round) {
      std::vector<size_t> cuts;
      std::bernoulli_distribution cut_here(round % 2 == 0 ? 0.15 : 0.5);
      for (size_t i = 1; i < text.size(); ++i) {
        if (IsCharBoundary(text, i) && cut_here(rng)) cuts.push_back(i);
      }
      Collected split = RunChunks(config.format, config.tools_enabled, SplitAt(text, cuts));
      ExpectSame(split, whole, "text [" + text + "] round " + std::to_string(round));
      for (const ChatOutputDelta& delta : split.deltas) {
        EXPECT_TRUE(IsValidUtf8(delta.content)) << delta.content;
        EXPECT_TRUE(IsValidUtf8(delta.reasoning)) << delta.reasoning;
      }
    }
  }
}

// Texts glued from fragments the parsers care about (tags, their prefixes, JSON pieces,
// whitespace, multibyte characters): splits must not matter for these either.
TEST_P(SplitInvarianceTest, RandomFragmentTexts) {
  static const std::vector<std::string> fragments = {"<think>",
                                                     "</think>",
                                                     "<tool_call>",
                                                     "</tool_call>",
                                                     "<|python_tag|>",
                                                     "<",
                                                     "</",
                                                     "<tool_",
                                                     "</think",
                                                     "<thi",
                                                     "\n",
                                                     "\n\n",
                                                     " ",
                                                     "{",
                                                     "}",
                                                     ";",
                                                     "\"",
                                                     "\\",
                                                     "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
                                                     "{\"name\": \"g\", \"parameters\": {}}",
                                                     "text",
                                                     "é",
                                                     "🌍",
                                                     "東京"};
  const Config& config = GetParam();
  std::mt19937 rng(99);
  std::uniform_int_distribution<size_t> pick(0, fragments.size() - 1);
  std::uniform_int_distribution<int> count(1, 10);
  for (int sample = 0; sample < 300; ++sample) {
    std::string text;
    for (int n = count(rng); n > 0; --n) text += fragments[pick(rng)];
    const Collected whole = RunWhole(config.format, config.tools_enabled, text);
    if (config.passthrough) {
      EXPECT_EQ(whole.content, text);
    }
    ExpectSame(RunChunks(config.format, config.tools_enabled, Bytes(text)), whole,
               "text [" + text + "] bytes");
    std::uniform_int_distribution<size_t> where(0, text.size());
    for (int round = 0; round < 5; ++round) {
      std::vector<size_t> cuts = {where(rng), where(rng), where(rng)};
      std::sort(cuts.begin(), cuts.end());
      ExpectSame(RunChunks(config.format, config.tools_enabled, SplitAt(text, cuts)), whole,
                 "text [" + text + "] round " + std::to_string(round));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, SplitInvarianceTest, ::testing::ValuesIn(Configs()),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace specula
