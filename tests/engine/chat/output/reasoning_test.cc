// <think>…</think> splitting (docs/CHAT_OUTPUT.md §Reasoning), through the public parser.
#include <gtest/gtest.h>

#include "engine/chat/output/chat_output_parser.h"
#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula {
namespace {

using chat_output_testing::Bytes;
using chat_output_testing::Collected;
using chat_output_testing::RunChunks;
using chat_output_testing::RunWhole;

constexpr ChatOutputFormat kThinking{.reasoning = true};
constexpr ChatOutputFormat kStartsThinking{.reasoning = true, .starts_in_reasoning = true};

TEST(ReasoningTest, QwenThinkBlockThenContent) {
  Collected out = RunWhole(kThinking, false,
                           "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?");
  EXPECT_EQ(out.reasoning, "The user greets me.");
  EXPECT_EQ(out.content, "Hello! How can I help?");
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ReasoningTest, KeepsNewlinesInsideTheReasoning) {
  Collected out = RunWhole(kThinking, false, "<think>\n\nStep 1.\n\nStep 2.\n\n</think>\n\nDone");
  EXPECT_EQ(out.reasoning, "Step 1.\n\nStep 2.");
  EXPECT_EQ(out.content, "Done");
}

TEST(ReasoningTest, StripsOnlyNewlinesNotSpaces) {
  Collected out = RunWhole(kThinking, false, "<think> a </think>\n\n  b");
  EXPECT_EQ(out.reasoning, " a ");
  EXPECT_EQ(out.content, "  b");
}

TEST(ReasoningTest, EmptyThinkBlockYieldsNoReasoning) {
  Collected out = RunWhole(kThinking, false, "<think>\n\n</think>\n\nJust the answer.");
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, "Just the answer.");
  for (const ChatOutputDelta& delta :
       RunChunks(kThinking, false, Bytes("<think>\n\n</think>\n\nx")).deltas) {
    EXPECT_TRUE(delta.reasoning.empty());
  }
}

TEST(ReasoningTest, WhitespaceBeforeTheOpenTagIsIgnored) {
  Collected out = RunWhole(kThinking, false, " \n<think>r</think>c");
  EXPECT_EQ(out.reasoning, "r");
  EXPECT_EQ(out.content, "c");
}

TEST(ReasoningTest, ThinkTagLaterInContentIsContent) {
  const std::string text = "Use <think> tags like <think>this</think>.";
  Collected out = RunWhole(kThinking, false, text);
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, text);
}

TEST(ReasoningTest, OnlyTheFirstThinkBlockIsReasoning) {
  Collected out = RunWhole(kThinking, false, "<think>a</think>b<think>c</think>d</think>");
  EXPECT_EQ(out.reasoning, "a");
  EXPECT_EQ(out.content, "b<think>c</think>d</think>");
}

TEST(ReasoningTest, UnterminatedThinkBlockIsReasoning) {
  Collected out = RunWhole(kThinking, false, "<think>\nStill thinking when max_tokens hit\n\n");
  EXPECT_EQ(out.reasoning, "Still thinking when max_tokens hit");
  EXPECT_EQ(out.content, "");
}

TEST(ReasoningTest, PartialCloseTagAtTheEndIsReasoning) {
  Collected out = RunWhole(kThinking, false, "<think>\nabc\n</thi");
  EXPECT_EQ(out.reasoning, "abc\n</thi");
  EXPECT_EQ(out.content, "");
}

TEST(ReasoningTest, PartialOpenTagAloneIsContent) {
  Collected out = RunWhole(kThinking, false, "\n<thin");
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, "\n<thin");
}

TEST(ReasoningTest, NoThinkBlockMeansContentUnchanged) {
  const std::string text = "\n\nPlain answer\n";
  Collected out = RunWhole(kThinking, false, text);
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, text);
}

TEST(ReasoningTest, StartsInReasoningUntilCloseTag) {
  Collected out = RunWhole(kStartsThinking, false, "\nOkay, 2+2.\n</think>\n\n4");
  EXPECT_EQ(out.reasoning, "Okay, 2+2.");
  EXPECT_EQ(out.content, "4");
}

TEST(ReasoningTest, StartsInReasoningDropsARepeatedOpenTag) {
  Collected out = RunWhole(kStartsThinking, false, "<think>\nhmm\n</think>\n\nok");
  EXPECT_EQ(out.reasoning, "hmm");
  EXPECT_EQ(out.content, "ok");
}

TEST(ReasoningTest, StartsInReasoningUnterminatedIsAllReasoning) {
  Collected out = RunWhole(kStartsThinking, false, "no close tag at all");
  EXPECT_EQ(out.reasoning, "no close tag at all");
  EXPECT_EQ(out.content, "");
}

TEST(ReasoningTest, StartsInReasoningOutputEndingUndecidedIsReasoning) {
  // Whitespace or a prefix of "<think>" is all that came: still inside the prompt's block.
  Collected out = RunWhole(kStartsThinking, false, "\n\n<thi");
  EXPECT_EQ(out.reasoning, "<thi");
  EXPECT_EQ(out.content, "");
}

TEST(ReasoningTest, DisabledLeavesTagsInContent) {
  const std::string text = "<think>\nx\n</think>\n\ny";
  Collected out = RunWhole(ChatOutputFormat{}, false, text);
  EXPECT_EQ(out.reasoning, "");
  EXPECT_EQ(out.content, text);
}

TEST(ReasoningTest, ReasoningStreamsWithoutWaitingForTheCloseTag) {
  ChatOutputParser parser(kThinking, false);
  EXPECT_TRUE(parser.Push("<thi").empty());  // could still be the open tag
  EXPECT_EQ(parser.Push("nk>\nFirst").reasoning, "First");
  // Trailing newlines and a close-tag prefix wait: they vanish if the tag completes.
  EXPECT_EQ(parser.Push(" thought\n\n</th").reasoning, " thought");
  ChatOutputDelta delta = parser.Push("ink>\n\nAnswer");
  EXPECT_EQ(delta.reasoning, "");
  EXPECT_EQ(delta.content, "Answer");
  EXPECT_TRUE(parser.Finish().empty());
}

TEST(ReasoningTest, HeldNewlinesAreReleasedWhenReasoningGoesOn) {
  ChatOutputParser parser(kThinking, false);
  EXPECT_EQ(parser.Push("<think>a\n\n").reasoning, "a");
  EXPECT_EQ(parser.Push("</tx").reasoning, "\n\n</tx");
}

TEST(ReasoningTest, MultibyteTextAroundTags) {
  Collected out =
      RunWhole(kThinking, false, "<think>\n思考中…🤔\n</think>\n\nRéponse: 東京 ✓");
  EXPECT_EQ(out.reasoning, "思考中…🤔");
  EXPECT_EQ(out.content, "Réponse: 東京 ✓");
}

}  // namespace
}  // namespace specula
