// The parser object itself: delta emptiness, moving it mid-stream, Finish semantics.
#include "engine/chat/output/chat_output_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>

#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula {
namespace {

using chat_output_testing::Call;
using ::testing::ElementsAre;

constexpr ChatOutputFormat kQwen3{.tool_calls = ToolCallSyntax::kHermes, .reasoning = true};

TEST(ChatOutputDeltaTest, EmptyOnlyWhenNothingInIt) {
  EXPECT_TRUE(ChatOutputDelta{}.empty());
  ChatOutputDelta content;
  content.content = "a";
  EXPECT_FALSE(content.empty());
  ChatOutputDelta reasoning;
  reasoning.reasoning = "r";
  EXPECT_FALSE(reasoning.empty());
  ChatOutputDelta call;
  call.tool_calls.push_back(Call("f", "{}"));
  EXPECT_FALSE(call.empty());
}

TEST(ChatOutputParserTest, MovedMidStreamKeepsItsState) {
  ChatOutputParser first(kQwen3, true);
  EXPECT_EQ(first.Push("<think>\nhm").reasoning, "hm");
  EXPECT_EQ(first.Push("</think>\n\nOk.\n<tool_call>{\"name\": \"f\", ").content, "Ok.\n");
  ChatOutputParser second = std::move(first);
  ChatOutputDelta delta = second.Push("\"arguments\": {}}</tool_call>");
  EXPECT_THAT(delta.tool_calls, ElementsAre(Call("f", "{}")));
  ChatOutputParser third(ChatOutputFormat{}, false);
  third = std::move(second);
  EXPECT_EQ(third.Push("\nbye").content, "bye");
}

TEST(ChatOutputParserTest, FinishTwiceGivesNothingMore) {
  ChatOutputParser parser(kQwen3, true);
  EXPECT_TRUE(parser.Push("<tool_call>{").empty());
  EXPECT_EQ(parser.Finish().content, "<tool_call>{");
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(ChatOutputParserTest, ReasoningAndContentInOneDelta) {
  ChatOutputParser parser(kQwen3, true);
  ChatOutputDelta delta = parser.Push("<think>\nr\n</think>\n\nc");
  EXPECT_EQ(delta.reasoning, "r");
  EXPECT_EQ(delta.content, "c");
}

}  // namespace
}  // namespace specula
