#include "server/status.h"

#include <string>

#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(StatusTest, OkStaysOk) {
  grpc::Status s = ToGrpcStatus(absl::OkStatus());
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OK);
  EXPECT_EQ(s.error_message(), "");
}

// absl and gRPC number the canonical codes alike; the converter must keep code and message.
TEST(StatusTest, EveryCanonicalCodeMapsByNumberWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), "why it failed: 'x'");
    const grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(out.error_code()), code);
    EXPECT_EQ(out.error_message(), "why it failed: 'x'");
  }
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("m")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("m")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("m")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(StatusTest, NonCanonicalCodeBecomesUnknown) {
  const grpc::Status out = ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(out.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(out.error_message(), "odd");
}

TEST(StatusTest, CodeNamesAreTheCanonicalUpperCaseNames) {
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kCancelled), "CANCELLED");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kUnavailable), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(static_cast<absl::StatusCode>(42)), "UNKNOWN");
  // Same spelling as absl's own printer for every canonical code.
  for (int code = 0; code <= 16; ++code) {
    const auto c = static_cast<absl::StatusCode>(code);
    EXPECT_EQ(std::string(StatusCodeName(c)), absl::StatusCodeToString(c)) << code;
  }
}

}  // namespace
}  // namespace specula
