// The per-request log line: a failed request says why (issue 32: requests that ended with
// RESOURCE_EXHAUSTED mid-generation left no reason in the log).
#include "server/request_log.h"

#include <string>
#include <vector>

#include "engine/common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class RequestLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSinkForTesting([this](absl::string_view line) { lines_.emplace_back(line); });
  }
  void TearDown() override { SetLogSinkForTesting(nullptr); }
  std::string Finish(const RequestSummary& s) {
    log_.OnFinished(s);
    FlushAsyncLog();
    return lines_.empty() ? "" : lines_.back();
  }
  RequestLog log_;
  std::vector<std::string> lines_;
};

TEST_F(RequestLogTest, AFailedRequestLogsItsErrorAtWarning) {
  RequestSummary s;
  s.request_id = "r1";
  s.code = absl::StatusCode::kResourceExhausted;
  s.error = "resuming after preemption: KV cache full";
  const std::string line = Finish(s);
  EXPECT_THAT(line, HasSubstr("level=warning event=request_finished request_id=r1 "
                              "status=RESOURCE_EXHAUSTED"));
  EXPECT_THAT(line, HasSubstr("error=\"resuming after preemption: KV cache full\""));
}

TEST_F(RequestLogTest, AFinishedRequestHasNoErrorField) {
  RequestSummary s;
  s.request_id = "r2";
  s.finish = FinishReason::kStop;
  const std::string line = Finish(s);
  EXPECT_THAT(line, HasSubstr("level=info event=request_finished request_id=r2 status=OK"));
  EXPECT_THAT(line, Not(HasSubstr("error=")));
}

}  // namespace
}  // namespace specula
