// Hermes / Qwen <tool_call> blocks (docs/CHAT_OUTPUT.md §Hermes), through the public parser.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/chat/output/chat_output_parser.h"
#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula {
namespace {

using chat_output_testing::Bytes;
using chat_output_testing::Call;
using chat_output_testing::Collected;
using chat_output_testing::RunChunks;
using chat_output_testing::RunWhole;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr ChatOutputFormat kHermes{.tool_calls = ToolCallSyntax::kHermes};
constexpr ChatOutputFormat kQwen3{.tool_calls = ToolCallSyntax::kHermes, .reasoning = true};

const std::string kWeatherCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const std::string kTimeCall =
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"h24\": true}}\n"
    "</tool_call>";

std::string Block(const std::string& body) { return "<tool_call>\n" + body + "\n</tool_call>"; }

TEST(HermesTest, SingleCall) {
  Collected out = RunWhole(kHermes, true, kWeatherCall);
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(out.content, "");
  EXPECT_EQ(out.reasoning, "");
}

TEST(HermesTest, SeveralCallsSeparatedByNewlines) {
  Collected out = RunWhole(kHermes, true, kWeatherCall + "\n" + kTimeCall + "\n");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})"),
                                          Call("get_time", R"({"tz":"CET","h24":true})")));
  EXPECT_EQ(out.content, "");
}

TEST(HermesTest, ArgumentsKeepTheModelsKeyOrder) {
  Collected out = RunWhole(
      kHermes, true,
      Block(
          R"({"name": "f", "arguments": {"zeta": 1, "alpha": {"y": [1, 2.5], "b": null}, "mid": "s"}})"));
  EXPECT_THAT(out.tool_calls,
              ElementsAre(Call("f", R"({"zeta":1,"alpha":{"y":[1,2.5],"b":null},"mid":"s"})")));
}

TEST(HermesTest, ArgumentsAsAJsonStringAreParsed) {
  Collected out = RunWhole(
      kHermes, true, Block(R"({"name": "f", "arguments": "{\"city\": \"Paris\", \"n\": 2}"})"));
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", R"({"city":"Paris","n":2})")));
  EXPECT_EQ(out.content, "");
}

TEST(HermesTest, MissingArgumentsMeanNone) {
  Collected out = RunWhole(kHermes, true, Block(R"({"name": "get_time"})"));
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_time", "{}")));
}

TEST(HermesTest, WhitespaceAroundTheJsonIsTolerated) {
  Collected out =
      RunWhole(kHermes, true,
               "<tool_call>  \n\t{\"name\":\"f\",\"arguments\":{\"a\":1}} \r\n\n</tool_call>");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("f", R"({"a":1})")));
  EXPECT_EQ(out.content, "");
}

TEST(HermesTest, NonAsciiArgumentsStayUtf8) {
  Collected out = RunWhole(
      kHermes, true,
      Block(R"({"name": "translate", "arguments": {"text": "Zürich 東京 🌍", "to": "\u00e9"}})"));
  EXPECT_THAT(out.tool_calls,
              ElementsAre(Call("translate", "{\"text\":\"Zürich 東京 🌍\",\"to\":\"é\"}")));
}

// Every way a block can be malformed: the block, tags included, comes back as content.
TEST(HermesTest, MalformedBlocksAreContentVerbatim) {
  const std::vector<std::string> bodies = {
      R"({"name": "f", "arguments": {"a": 1})",          // unbalanced
      R"(not json at all)",                              // not JSON
      R"({"arguments": {"a": 1}})",                      // no name
      R"({"name": 42, "arguments": {}})",                // name not a string
      R"({"name": "", "arguments": {}})",                // empty name
      R"({"name": "f", "arguments": [1, 2]})",           // arguments not an object
      R"({"name": "f", "arguments": "Paris"})",          // string that is not JSON
      R"({"name": "f", "arguments": "[1]"})",            // string holding a non-object
      R"({"name": "f", "arguments": null})",             // null
      R"(["f", {}])",                                    // not an object
      R"({"name": "f", "arguments": {}} trailing)",      // extra text
      R"({"name": "f", "arguments": {}}{"name": "g"})",  // two objects
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body);
    const std::string text = "Before " + Block(body) + " after";
    Collected out = RunWhole(kHermes, true, text);
    EXPECT_THAT(out.tool_calls, IsEmpty());
    EXPECT_EQ(out.content, text);
    EXPECT_EQ(out.malformed_tool_calls, 1);  // counted: specula_tool_call_parse_failures_total
  }
}

TEST(HermesTest, MalformedBlockBetweenValidCallsIsContent) {
  const std::string bad = Block("{oops}");
  Collected out = RunWhole(kHermes, true, kWeatherCall + "\n" + bad + "\n" + kTimeCall);
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[1].name, "get_time");
  EXPECT_EQ(out.content, bad + "\n");  // the newline after a call is dropped, not the one after bad
  EXPECT_EQ(out.malformed_tool_calls, 1);
}

TEST(HermesTest, ContentBeforeACall) {
  Collected out = RunWhole(kHermes, true, "Let me check the weather.\n\n" + kWeatherCall);
  EXPECT_EQ(out.content, "Let me check the weather.\n\n");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
}

TEST(HermesTest, InterleavedContentAndCalls) {
  Collected out =
      RunWhole(kHermes, true, "First.\n" + kWeatherCall + "\nThen.\n" + kTimeCall + "\nDone.");
  EXPECT_EQ(out.content, "First.\nThen.\nDone.");
  EXPECT_THAT(out.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})"),
                                          Call("get_time", R"({"tz":"CET","h24":true})")));
}

TEST(HermesTest, WhitespaceOnlyOutputWithoutCallsIsContent) {
  EXPECT_EQ(RunWhole(kHermes, true, "\n \n").content, "\n \n");
  EXPECT_EQ(RunWhole(kHermes, true, "\n" + Block("bad")).content, "\n" + Block("bad"));
}

TEST(HermesTest, WhitespaceAroundCallsIsNotContent) {
  Collected out = RunWhole(kHermes, true, "\n\n" + kWeatherCall + " \n\n" + kTimeCall + "\n\n");
  EXPECT_EQ(out.content, "");
  EXPECT_EQ(out.tool_calls.size(), 2u);
}

TEST(HermesTest, CallIsEmittedWhenItsCloseTagArrives) {
  ChatOutputParser parser(kHermes, true);
  EXPECT_EQ(parser.Push("Sure.\n<tool_").content, "Sure.\n");
  EXPECT_TRUE(parser.Push("call>\n{\"name\": \"get_weather\", ").empty());
  EXPECT_TRUE(parser.Push("\"arguments\": {\"city\": \"Paris\"}}\n</tool_ca").empty());
  ChatOutputDelta delta = parser.Push("ll>");
  EXPECT_THAT(delta.tool_calls, ElementsAre(Call("get_weather", R"({"city":"Paris"})")));
  EXPECT_EQ(delta.content, "");
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(HermesTest, StreamedCallTextNeverReachesContent) {
  const std::string text = "Checking.\n" + kWeatherCall + "\n" + kTimeCall;
  for (const ChatOutputDelta& delta : RunChunks(kHermes, true, Bytes(text)).deltas) {
    EXPECT_EQ(delta.content.find_first_of("<{}>\""), std::string::npos) << delta.content;
  }
  EXPECT_EQ(RunChunks(kHermes, true, Bytes(text)).content, "Checking.\n");
}

TEST(HermesTest, UnterminatedBlockIsContentAtFinish) {
  const std::string text = "Hi " + std::string("<tool_call>\n{\"name\": \"get_weather\", \"argu");
  ChatOutputParser parser(kHermes, true);
  EXPECT_EQ(parser.Push(text).content, "Hi ");
  ChatOutputDelta last = parser.Finish();
  EXPECT_EQ(last.content, text.substr(3));
  EXPECT_THAT(last.tool_calls, IsEmpty());
  EXPECT_EQ(last.malformed_tool_calls, 1);
}

TEST(HermesTest, PartialOpenTagIsHeldThenReleased) {
  ChatOutputParser parser(kHermes, true);
  EXPECT_EQ(parser.Push("a <tool_").content, "a ");
  EXPECT_EQ(parser.Push("x>").content, "<tool_x>");
  EXPECT_EQ(parser.Push("<").content, "");
  EXPECT_EQ(parser.Finish().content, "<");
}

TEST(HermesTest, ToolsDisabledLeavesBlocksInContent) {
  const std::string text = "Text " + kWeatherCall;
  Collected out = RunWhole(kHermes, false, text);
  EXPECT_THAT(out.tool_calls, IsEmpty());
  EXPECT_EQ(out.content, text);
}

TEST(HermesTest, NoneSyntaxLeavesBlocksInContent) {
  const std::string text = kWeatherCall + "\n";
  Collected out = RunWhole(ChatOutputFormat{}, true, text);
  EXPECT_THAT(out.tool_calls, IsEmpty());
  EXPECT_EQ(out.content, text);
}

TEST(HermesTest, Qwen3ReasoningThenCalls) {
  Collected out = RunWhole(kQwen3, true,
                           "<think>\nThe user wants the weather and time.\n</think>\n\n" +
                               kWeatherCall + "\n" + kTimeCall);
  EXPECT_EQ(out.reasoning, "The user wants the weather and time.");
  EXPECT_EQ(out.content, "");
  EXPECT_EQ(out.tool_calls.size(), 2u);
}

TEST(HermesTest, CallInsideReasoningIsReasoning) {
  const std::string thought = "maybe " + kWeatherCall;
  Collected out = RunWhole(kQwen3, true, "<think>\n" + thought + "\n</think>\n\nNo call needed.");
  EXPECT_EQ(out.reasoning, thought);
  EXPECT_EQ(out.content, "No call needed.");
  EXPECT_THAT(out.tool_calls, IsEmpty());
}

TEST(HermesTest, MultibyteContentAroundCalls) {
  Collected out = RunWhole(kHermes, true, "Voilà 🌍 :\n" + kWeatherCall + "\nFertig ✓ — 東京");
  EXPECT_EQ(out.content, "Voilà 🌍 :\nFertig ✓ — 東京");
  EXPECT_EQ(out.tool_calls.size(), 1u);
}

}  // namespace
}  // namespace specula
