#include "engine/sampling/stop_matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

// Pushes chunks in order; returns everything emitted (including Flush when not stopped) and
// whether a stop string matched.
struct Outcome {
  std::string emitted;
  bool stopped = false;
};
Outcome Feed(std::vector<std::string> stops, const std::vector<std::string>& chunks) {
  StopMatcher m(std::move(stops));
  Outcome run;
  for (const std::string& c : chunks) {
    StopMatcher::Result r = m.Push(c);
    run.emitted += r.text;
    if (r.stopped) {
      run.stopped = true;
      return run;
    }
  }
  run.emitted += m.Flush();
  return run;
}

TEST(StopMatcherTest, MatchInsideOneChunk) {
  StopMatcher m({"STOP"});
  StopMatcher::Result r = m.Push("hello STOP world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hello ");
  EXPECT_EQ(m.Flush(), "");
  r = m.Push("more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcherTest, MatchAcrossTwoChunksHoldsPrefix) {
  StopMatcher m({"</s>"});
  StopMatcher::Result r = m.Push("abc</");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "abc");  // "</" might start the stop string
  r = m.Push("s>tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcherTest, MatchAcrossThreeChunks) {
  StopMatcher m({"<|end|>"});
  StopMatcher::Result r = m.Push("x<|");
  EXPECT_EQ(r.text, "x");
  r = m.Push("en");
  EXPECT_EQ(r.text, "");
  EXPECT_FALSE(r.stopped);
  r = m.Push("d|>y");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopMatcherTest, OverlappingPrefixes) {
  Outcome run = Feed({"abab"}, {"abaabab"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.emitted, "aba");
  run = Feed({"abab"}, {"ab", "a", "a", "b", "ab", "zz"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.emitted, "aba");
  // Held "aba" fails as "abaa" but its suffix "a" may still start the stop string.
  StopMatcher m({"abab"});
  EXPECT_EQ(m.Push("aba").text, "");
  EXPECT_EQ(m.Push("a").text, "aba");
  EXPECT_EQ(m.Flush(), "a");
}

TEST(StopMatcherTest, EarliestEndingMatchWins) {
  Outcome run = Feed({"world", "lo w"}, {"hello world"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.emitted, "hel");
  run = Feed({"cd", "abcdef"}, {"xxabcdef"});
  EXPECT_EQ(run.emitted, "xxab");  // "cd" completes first, as it would when streamed
  // Same end: the longer stop string wins so none of it is emitted.
  run = Feed({"b", "ab"}, {"xa", "b"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.emitted, "x");
}

TEST(StopMatcherTest, NoFalseHoldBackAfterFailedPartialMatch) {
  StopMatcher m({"abc"});
  StopMatcher::Result r = m.Push("xab");
  EXPECT_EQ(r.text, "x");
  r = m.Push("x");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, "abx");  // nothing is held once the partial match failed
  EXPECT_EQ(m.Flush(), "");
  r = m.Push("plain text");
  EXPECT_EQ(r.text, "plain text");
}

TEST(StopMatcherTest, HoldsOnlyLongestUsefulSuffix) {
  StopMatcher m({"xyz", "yq"});
  StopMatcher::Result r = m.Push("axy");
  EXPECT_EQ(r.text, "a");  // "xy" is a prefix of "xyz"
  r = m.Push("y");
  EXPECT_EQ(r.text, "xy");  // "yy" is no prefix; "y" is a prefix of both
  EXPECT_EQ(m.Flush(), "y");
}

TEST(StopMatcherTest, Utf8MultiByteText) {
  // "終了" (end) as the stop string; its first character is three bytes.
  const std::string stop = "\xE7\xB5\x82\xE4\xBA\x86";
  Outcome run = Feed({stop}, {"h\xC3\xA9llo \xE7\xB5\x82", "\xE4\xBA\x86!"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.emitted, "h\xC3\xA9llo ");

  // A stop string sharing a lead byte with the text: the held suffix is whole characters.
  StopMatcher m({"\xE7\xB5\x82\xE4\xBA\x86"});
  StopMatcher::Result r = m.Push("\xE7\xB5\x82");  // held: may start the stop
  EXPECT_EQ(r.text, "");
  r = m.Push("\xE7\xB5\xB5");  // a different character with the same lead bytes
  EXPECT_EQ(r.text, "\xE7\xB5\x82\xE7\xB5\xB5");
  EXPECT_EQ(m.Flush(), "");

  // A stop string that starts mid-character never splits the text inside a character.
  StopMatcher odd({"\xB5\x82X"});
  r = odd.Push("a\xE7\xB5\x82");
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(odd.Flush(), "\xE7\xB5\x82");
}

TEST(StopMatcherTest, FlushReleasesHeldText) {
  StopMatcher m({"###"});
  StopMatcher::Result r = m.Push("answer ##");
  EXPECT_EQ(r.text, "answer ");
  EXPECT_EQ(m.Flush(), "##");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, NoStopStringsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace specula
