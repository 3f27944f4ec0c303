// RequestStream: coalescing, the one-shot ready notification, and the end of the stream.
#include "engine/serve/request_stream.h"

#include "gtest/gtest.h"

namespace specula {
namespace {

SequenceOutput Token(int32_t id, std::string text) {
  SequenceOutput out;
  out.tokens = {id};
  out.text = std::move(text);
  return out;
}

TEST(RequestStreamTest, CoalescesWhatTheReaderHasNotTaken) {
  RequestStream stream;
  stream.Append(Token(5, "a"));
  stream.Append(Token(6, "b"));
  stream.Append(Token(7, "c"));
  StreamChunk chunk;
  ASSERT_TRUE(stream.Take(&chunk));
  EXPECT_EQ(chunk.tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(chunk.text, "abc");
  EXPECT_FALSE(chunk.done);
  EXPECT_FALSE(stream.Take(&chunk));
}

TEST(RequestStreamTest, NotifiesOnceAfterAnEmptyTake) {
  int calls = 0;
  RequestStream stream([&] { ++calls; });
  stream.Append(Token(1, "x"));
  EXPECT_EQ(calls, 0) << "nobody asked yet";
  StreamChunk chunk;
  ASSERT_TRUE(stream.Take(&chunk));
  EXPECT_FALSE(stream.Take(&chunk));  // arms
  stream.Append(Token(2, "y"));
  stream.Append(Token(3, "z"));
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(stream.Take(&chunk));
  EXPECT_EQ(chunk.text, "yz");
}

TEST(RequestStreamTest, CloseEndsTheStreamWithPendingData) {
  int calls = 0;
  RequestStream stream([&] { ++calls; });
  StreamChunk chunk;
  EXPECT_FALSE(stream.Take(&chunk));
  stream.Append(Token(4, "w"));
  stream.Close(absl::OkStatus(), FinishReason::kLength, TokenUsage{3, 1, 0});
  stream.Append(Token(9, "ignored"));
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(stream.Take(&chunk));
  EXPECT_TRUE(chunk.done);
  EXPECT_EQ(chunk.text, "w");
  EXPECT_EQ(chunk.finish, FinishReason::kLength);
  EXPECT_EQ(chunk.prompt_tokens, 3);
  EXPECT_EQ(chunk.completion_tokens, 1);
  EXPECT_FALSE(stream.Take(&chunk));
  stream.Close(absl::CancelledError(), FinishReason::kCancelled, TokenUsage{});
  EXPECT_EQ(calls, 1) << "nothing is armed after the end was taken";
}

TEST(RequestStreamTest, EmptyOutputsDoNotWakeTheReader) {
  int calls = 0;
  RequestStream stream([&] { ++calls; });
  StreamChunk chunk;
  EXPECT_FALSE(stream.Take(&chunk));
  stream.Append(SequenceOutput());
  EXPECT_EQ(calls, 0);
  stream.Close(absl::CancelledError("gone"), FinishReason::kCancelled, TokenUsage{2, 0, 0});
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(stream.Take(&chunk));
  EXPECT_TRUE(chunk.done);
  EXPECT_TRUE(absl::IsCancelled(chunk.status));
}

}  // namespace
}  // namespace specula
