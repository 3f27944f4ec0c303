#include "engine/common/log.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// 2026-11-21T16:30:00.123Z
const std::chrono::system_clock::time_point kTime =
    std::chrono::system_clock::time_point(std::chrono::milliseconds(1795278600123LL));

// Captures lines for the test's lifetime and restores the global state afterwards.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = GetLogLevel();
    SetLogSinkForTesting([this](absl::string_view line) { lines_.emplace_back(line); });
  }
  void TearDown() override {
    SetLogSinkForTesting(nullptr);
    SetLogLevel(saved_level_);
  }

  std::vector<std::string> lines_;
  LogLevel saved_level_ = LogLevel::kInfo;
};

TEST_F(LogTest, FormatsTimestampLevelEventAndFieldsInOrder) {
  EXPECT_EQ(FormatLogLine(kTime, LogLevel::kInfo, "request_finished",
                          {{"request_id", "abc"}, {"prompt_tokens", 5}, {"status", "OK"}}),
            "ts=2026-11-21T16:30:00.123Z level=info event=request_finished request_id=abc "
            "prompt_tokens=5 status=OK");
}

TEST_F(LogTest, FormatsEveryValueType) {
  const std::string s = "str";
  const std::string_view sv = "view";
  const absl::string_view asv = "aview";
  const uint64_t big = 18446744073709551615ULL;
  EXPECT_EQ(FormatLogLine(kTime, LogLevel::kDebug, "e",
                          {{"s", s},
                           {"sv", sv},
                           {"asv", asv},
                           {"lit", "x"},
                           {"t", true},
                           {"f", false},
                           {"i", -7},
                           {"i64", int64_t{-9000000000}},
                           {"u", big},
                           {"u8", uint8_t{200}},
                           {"d", 0.25},
                           {"fl", 1.5f}}),
            "ts=2026-11-21T16:30:00.123Z level=debug event=e s=str sv=view asv=aview lit=x "
            "t=true f=false i=-7 i64=-9000000000 u=18446744073709551615 u8=200 d=0.25 fl=1.5");
}

TEST_F(LogTest, QuotesAndEscapesValuesThatNeedIt) {
  const std::string line = FormatLogLine(kTime, LogLevel::kWarning, "e",
                                         {{"space", "a b"},
                                          {"eq", "k=v"},
                                          {"quote", "say \"hi\""},
                                          {"backslash", "C:\\x"},
                                          {"newline", "l1\nl2"},
                                          {"ctrl", std::string("a\x01", 2)},
                                          {"empty", ""}});
  EXPECT_EQ(line,
            "ts=2026-11-21T16:30:00.123Z level=warning event=e space=\"a b\" eq=\"k=v\" "
            "quote=\"say \\\"hi\\\"\" backslash=\"C:\\\\x\" newline=\"l1\\nl2\" "
            "ctrl=\"a\\x01\" empty=\"\"");
}

TEST_F(LogTest, SanitizesBadKeysAndQuotesEvents) {
  EXPECT_EQ(FormatLogLine(kTime, LogLevel::kError, "two words", {{"a key", 1}, {"", 2}}),
            "ts=2026-11-21T16:30:00.123Z level=error event=\"two words\" a_key=1 _=2");
}

TEST_F(LogTest, TimestampBeforeEpochIsWellFormed) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(-1));
  EXPECT_THAT(FormatLogLine(t, LogLevel::kInfo, "e", {}), HasSubstr("ts=1969-12-31T23:59:59.999Z"));
}

TEST_F(LogTest, ParseLogLevelAcceptsNamesCaseInsensitively) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("INFO"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("Warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    EXPECT_EQ(*ParseLogLevel(LogLevelName(l)), l);
  }
}

TEST_F(LogTest, ParseLogLevelRejectsUnknownNamesListingTheAcceptedOnes) {
  for (absl::string_view bad : {"", "verbose", "fatal", "info "}) {
    absl::StatusOr<LogLevel> level = ParseLogLevel(bad);
    ASSERT_FALSE(level.ok()) << bad;
    EXPECT_EQ(level.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(level.status().message(), HasSubstr("debug, info, warning, error"));
    EXPECT_THAT(level.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST_F(LogTest, DropsEventsBelowTheMinimumLevel) {
  SetLogLevel(LogLevel::kWarning);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  Log(LogLevel::kDebug, "d");
  Log(LogLevel::kInfo, "i");
  Log(LogLevel::kWarning, "w");
  Log(LogLevel::kError, "e", {{"k", "v"}});
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_THAT(lines_[0], HasSubstr("level=warning event=w"));
  EXPECT_THAT(lines_[1], HasSubstr("level=error event=e k=v"));
  SetLogLevel(LogLevel::kDebug);
  Log(LogLevel::kDebug, "d");
  EXPECT_EQ(lines_.size(), 3u);
}

TEST_F(LogTest, LogWritesAWellFormedCurrentTimestamp) {
  Log(LogLevel::kInfo, "started", {{"port", 50051}});
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_TRUE(std::regex_match(lines_[0],
                               std::regex(R"(ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=info )"
                                          R"(event=started port=50051)")))
      << lines_[0];
}

// Without a sink, lines go to stderr, newline-terminated.
TEST(LogStderrTest, WritesOneLinePerEventToStderr) {
  ::testing::internal::CaptureStderr();
  Log(LogLevel::kError, "boom", {{"why", "disk full"}});
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(
      std::regex_match(out, std::regex(R"(ts=\S+ level=error event=boom why="disk full"\n)")))
      << out;
}

// Lines from concurrent threads arrive whole: the sink sees each exactly once, never mixed.
TEST_F(LogTest, ConcurrentLinesNeverInterleave) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) {
        Log(LogLevel::kInfo, "tick", {{"thread", t}, {"i", i}, {"pad", std::string(200, 'x')}});
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(lines_.size(), static_cast<size_t>(kThreads * kPerThread));
  const std::regex shape(R"(ts=\S+ level=info event=tick thread=(\d) i=(\d+) pad=x{200})");
  std::vector<std::vector<int>> seen(kThreads, std::vector<int>(kPerThread, 0));
  for (const std::string& line : lines_) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, shape)) << line;
    ++seen[std::stoi(m[1])][std::stoi(m[2])];
  }
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) EXPECT_EQ(seen[t][i], 1);
  }
}

TEST_F(LogTest, AsyncLinesArriveInOrderAfterFlush) {
  for (int i = 0; i < 100; ++i) LogAsync(LogLevel::kInfo, "async", {{"i", i}});
  LogAsync(LogLevel::kDebug, "below_the_level");
  FlushAsyncLog();
  ASSERT_EQ(lines_.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_THAT(lines_[i], ::testing::EndsWith(absl::StrCat("event=async i=", i)));
  }
}

TEST(LogAsyncTest, ABlockedSinkNeverBlocksTheCallerAndDropsAreReported) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::string> lines;
  SetLogSinkForTesting([&](absl::string_view line) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });  // a stderr that does not drain
    lines.emplace_back(line);
  });
  const auto start = std::chrono::steady_clock::now();
  const size_t total = kAsyncLogQueueLines * 2 + 10;
  for (size_t i = 0; i < total; ++i) LogAsync(LogLevel::kWarning, "flood", {{"i", i}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
      << "callers returned although nothing could be written";
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  FlushAsyncLog();
  SetLogSinkForTesting(nullptr);
  // Every line is accounted for: written, or counted in a log_lines_dropped report.
  size_t written = 0, dropped = 0;
  const std::regex report(R"(.* event=log_lines_dropped lines=(\d+))");
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_match(line, m, report)) {
      dropped += std::stoul(m[1]);
    } else {
      ++written;
    }
  }
  EXPECT_GT(dropped, 0u) << "the queue is bounded";
  EXPECT_EQ(written + dropped, total);
}

}  // namespace
}  // namespace specula
