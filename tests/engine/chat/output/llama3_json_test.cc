// Llama 3.1 JSON tool calls (docs/CHAT_OUTPUT.md §Llama 3 JSON), through the public parser.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/chat/output/chat_output_parser.h"
#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula {
namespace {

using chat_output_testing::Call;
using chat_output_testing::Collected;
using chat_output_testing::RunWhole;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr ChatOutputFormat kLlama{.tool_calls = ToolCallSyntax::kLlama3Json};

const std::string kWeather = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
const std::string kTime = R"({"name": "get_time", "parameters": {"tz": "CET"}})";

TEST(Llama3JsonTest, WholeOutputIsOneCall) {
  Collected out = RunWhole(kLlama, true, kWeather);
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(out.content, "");
}

TEST(Llama3JsonTest, ArgumentsKeyIsAcceptedToo) {
  Collected out = RunWhole(kLlama, true, R"({"name": "f", "arguments": {"b": 2, "a": 1}})");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", R"({"b":2,"a":1})")));
}

TEST(Llama3JsonTest, PythonTagAndWhitespaceBeforeTheCall) {
  Collected out = RunWhole(kLlama, true, "\n <|python_tag|>\n" + kWeather + "\n");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(out.content, "");
}

TEST(Llama3JsonTest, SemicolonSeparatedCalls) {
  Collected out = RunWhole(kLlama, true, "<|python_tag|>" + kWeather + "; " + kTime + ";");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})"),
                                          Call("get_time", R"({"tz":"CET"})")));
  EXPECT_EQ(out.content, "");
}

TEST(Llama3JsonTest, BracesAndSemicolonsInsideStrings) {
  Collected out = RunWhole(
      kLlama, true,
      R"({"name": "sql", "parameters": {"q": "SELECT '}'; -- {\"x\""}};{"name": "g", "parameters": {}})");
  EXPECT_THAT(out.tool_calls,
              ElementsAre(Call("sql", R"({"q":"SELECT '}'; -- {\"x\""})"), Call("g", "{}")));
}

TEST(Llama3JsonTest, NothingIsEmittedBeforeFinishWhenOutputStartsWithABrace) {
  ChatOutputParser parser(kLlama, true);
  EXPECT_TRUE(parser.Push(" {\"name\": \"get_weather\", ").empty());
  EXPECT_TRUE(parser.Push("\"parameters\": {\"city\": \"Paris\"}}").empty());
  ChatOutputDelta last = parser.Finish();
  EXPECT_THAT(last.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(last.content, "");
}

// Output that starts with '{' but is not a list of calls: the held text is content, unchanged.
TEST(Llama3JsonTest, BraceOutputThatIsNotACallIsContent) {
  const std::vector<std::string> texts = {
      "{not json}",
      "  {\"name\": \"Alice\", \"age\": 30}",                   // an answer, no parameters
      "{\"a\": 1}",                                             // no name
      kWeather + " and then some prose",                        // text after the call
      kWeather + "; oops",                                      // a non-call after ';'
      kWeather + "\n" + kTime,                                  // no ';' between
      "{\"name\": \"f\", \"parameters\": [1]}",                 // parameters not an object
      "{\"name\": \"f\", \"parameters\": {\"unterminated\": ",  // cut off (max_tokens)
      "<|python_tag|>{}",
  };
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    ChatOutputParser parser(kLlama, true);
    EXPECT_TRUE(parser.Push(text).empty());
    ChatOutputDelta last = parser.Finish();
    EXPECT_THAT(last.tool_calls, IsEmpty());
    EXPECT_EQ(last.content, text);
    EXPECT_EQ(last.malformed_tool_calls, 1);  // it began as a call
  }
}

TEST(Llama3JsonTest, OtherOutputStreamsImmediately) {
  ChatOutputParser parser(kLlama, true);
  EXPECT_EQ(parser.Push("The weather ").content, "The weather ");
  EXPECT_EQ(parser.Push(kWeather).content, kWeather);  // JSON later on is content
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(Llama3JsonTest, LeadingWhitespaceWaitsForTheFirstCharacter) {
  ChatOutputParser parser(kLlama, true);
  EXPECT_TRUE(parser.Push("\n ").empty());
  EXPECT_EQ(parser.Push("Hi").content, "\n Hi");
}

TEST(Llama3JsonTest, PythonTagWithoutJsonIsContent) {
  // Llama's built-in tools (brave_search.call(...)) are not parsed.
  const std::string text = "<|python_tag|>brave_search.call(query=\"Paris weather\")";
  ChatOutputParser parser(kLlama, true);
  EXPECT_EQ(parser.Push(text).content, text);
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(Llama3JsonTest, PartialPythonTagIsHeldThenReleased) {
  ChatOutputParser parser(kLlama, true);
  EXPECT_TRUE(parser.Push("<|pyth").empty());
  EXPECT_EQ(parser.Push("on>").content, "<|python>");
}

TEST(Llama3JsonTest, ToolsDisabledStreamsJsonAsContent) {
  ChatOutputParser parser(kLlama, false);
  EXPECT_EQ(parser.Push(kWeather).content, kWeather);
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(Llama3JsonTest, ReasoningThenCall) {
  Collected out = RunWhole({.tool_calls = ToolCallSyntax::kLlama3Json, .reasoning = true}, true,
                           "<think>\nneed weather\n</think>\n\n" + kWeather);
  EXPECT_EQ(out.reasoning, "need weather");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(out.content, "");
}

TEST(Llama3JsonTest, MultibyteArguments) {
  Collected out =
      RunWhole(kLlama, true, R"({"name": "say", "parameters": {"text": "¡Hola, 世界! 👋"}})");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("say", R"({"text":"¡Hola, 世界! 👋"})")));
}

}  // namespace
}  // namespace specula
