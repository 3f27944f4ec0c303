#include "engine/sampling/sampling_params.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Expects INVALID_ARGUMENT whose message contains `field`.
void ExpectRejected(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field));
}

TEST(SamplingParamsTest, DefaultsAndBoundariesAreValid) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.01f;
  p.frequency_penalty = -2.0f;
  p.presence_penalty = 2.0f;
  p.logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.min_p = 0.0f;
  p.logprobs = -1;
  p.top_p = 1e-6f;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

TEST(SamplingParamsTest, TemperatureMessageShowsValue) {
  SamplingParams p;
  p.temperature = -1.0f;
  absl::Status s = ValidateSamplingParams(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sampling.temperature must be >= 0, got -1");
}

struct FloatCase {
  const char* field;
  float SamplingParams::*member;
  float value;
};

class SamplingParamsRejectionTest : public ::testing::TestWithParam<FloatCase> {};

TEST_P(SamplingParamsRejectionTest, NamesField) {
  SamplingParams p;
  p.*(GetParam().member) = GetParam().value;
  ExpectRejected(ValidateSamplingParams(p), std::string("sampling.") + GetParam().field);
}

INSTANTIATE_TEST_SUITE_P(
    SamplingParamsFloats, SamplingParamsRejectionTest,
    ::testing::Values(FloatCase{"temperature", &SamplingParams::temperature, -0.5f},
                      FloatCase{"temperature", &SamplingParams::temperature, kNaN},
                      FloatCase{"temperature", &SamplingParams::temperature, kInf},
                      FloatCase{"top_p", &SamplingParams::top_p, 0.0f},
                      FloatCase{"top_p", &SamplingParams::top_p, 1.5f},
                      FloatCase{"top_p", &SamplingParams::top_p, -0.1f},
                      FloatCase{"top_p", &SamplingParams::top_p, kNaN},
                      FloatCase{"min_p", &SamplingParams::min_p, -0.01f},
                      FloatCase{"min_p", &SamplingParams::min_p, 1.01f},
                      FloatCase{"min_p", &SamplingParams::min_p, kNaN},
                      FloatCase{"repetition_penalty", &SamplingParams::repetition_penalty, 0.0f},
                      FloatCase{"repetition_penalty", &SamplingParams::repetition_penalty, -1.0f},
                      FloatCase{"repetition_penalty", &SamplingParams::repetition_penalty, kInf},
                      FloatCase{"frequency_penalty", &SamplingParams::frequency_penalty, 2.5f},
                      FloatCase{"frequency_penalty", &SamplingParams::frequency_penalty, -2.01f},
                      FloatCase{"frequency_penalty", &SamplingParams::frequency_penalty, -kInf},
                      FloatCase{"presence_penalty", &SamplingParams::presence_penalty, 3.0f},
                      FloatCase{"presence_penalty", &SamplingParams::presence_penalty, -3.0f},
                      FloatCase{"presence_penalty", &SamplingParams::presence_penalty, kNaN}));

TEST(SamplingParamsTest, RejectsNegativeTopK) {
  SamplingParams p;
  p.top_k = -1;
  ExpectRejected(ValidateSamplingParams(p), "sampling.top_k");
}

TEST(SamplingParamsTest, RejectsLogprobsOutOfRange) {
  SamplingParams p;
  p.logprobs = -2;
  ExpectRejected(ValidateSamplingParams(p), "sampling.logprobs");
  p.logprobs = 21;
  ExpectRejected(ValidateSamplingParams(p), "sampling.logprobs");
}

TEST(StoppingCriteriaTest, DefaultsAndBoundariesAreValid) {
  EXPECT_TRUE(ValidateStoppingCriteria(StoppingCriteria{}, 100).ok());
  StoppingCriteria s;
  s.max_tokens = 1;
  s.stop.assign(16, "x");
  s.stop[0] = std::string(1024, 'a');
  s.stop_token_ids = {0, 99};
  EXPECT_TRUE(ValidateStoppingCriteria(s, 100).ok());
}

TEST(StoppingCriteriaTest, RejectsMaxTokensBelowOne) {
  StoppingCriteria s;
  s.max_tokens = 0;
  ExpectRejected(ValidateStoppingCriteria(s, 100), "stopping.max_tokens");
}

TEST(StoppingCriteriaTest, RejectsEmptyStopString) {
  StoppingCriteria s;
  s.stop = {"ok", ""};
  absl::Status st = ValidateStoppingCriteria(s, 100);
  ExpectRejected(st, "stopping.stop[1]");
  EXPECT_THAT(std::string(st.message()), HasSubstr("empty"));
}

TEST(StoppingCriteriaTest, RejectsTooManyStopStrings) {
  StoppingCriteria s;
  s.stop.assign(17, "x");
  absl::Status st = ValidateStoppingCriteria(s, 100);
  ExpectRejected(st, "stopping.stop");
  EXPECT_THAT(std::string(st.message()), HasSubstr("at most 16"));
}

TEST(StoppingCriteriaTest, RejectsOverlongStopString) {
  StoppingCriteria s;
  s.stop = {std::string(1025, 'a')};
  absl::Status st = ValidateStoppingCriteria(s, 100);
  ExpectRejected(st, "stopping.stop[0]");
  EXPECT_THAT(std::string(st.message()), HasSubstr("1024 bytes"));
}

TEST(StoppingCriteriaTest, RejectsStopTokenIdsOutsideVocab) {
  StoppingCriteria s;
  s.stop_token_ids = {5, -1};
  ExpectRejected(ValidateStoppingCriteria(s, 100), "stopping.stop_token_ids[1]");
  s.stop_token_ids = {100};
  ExpectRejected(ValidateStoppingCriteria(s, 100), "stopping.stop_token_ids[0]");
}

}  // namespace
}  // namespace specula
