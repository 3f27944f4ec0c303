// The same weights under the config.json transformers 4 writes (rope_theta, rope_scaling,
// torch_dtype), under the one transformers 5 writes (rope_parameters, dtype), and sharded, must
// give bit-identical logits: a form that is misread (transformers 5's rope_parameters were once
// ignored, so its models ran with theta 10000 and no scaling) changes them.
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"

namespace specula {
namespace {

using ::specula::testing::SingleSequenceRunner;
using ::specula::testing::TestModelDir;

std::vector<float> PromptLogits(const std::string& model) {
  SingleSequenceRunner runner(TestModelDir(model));
  return runner.Run(::specula::testing::ParityPrompt(), /*all_rows=*/true);
}

struct FormPair {
  const char* classic;
  const char* other;
  friend void PrintTo(const FormPair& p, std::ostream* os) { *os << p.classic << " vs " << p.other; }
};

class ConfigFormsTest : public ::testing::TestWithParam<FormPair> {};

TEST_P(ConfigFormsTest, SameWeightsGiveIdenticalLogits) {
  const std::vector<float> classic = PromptLogits(GetParam().classic);
  const std::vector<float> other = PromptLogits(GetParam().other);
  ASSERT_EQ(classic.size(), other.size());
  EXPECT_TRUE(classic == other) << GetParam().classic << " vs " << GetParam().other;
}

INSTANTIATE_TEST_SUITE_P(
    Forms, ConfigFormsTest,
    ::testing::Values(FormPair{"llama3-f32", "llama3-f32-v5"},
                      FormPair{"llama3-f32", "llama3-f32-v5-sharded"},
                      FormPair{"qwen3-yarn", "qwen3-yarn-v5"}),
    [](const ::testing::TestParamInfo<FormPair>& info) {
      return ::specula::testing::GtestSafeName(info.param.other);
    });

// The variants above must differ from their base models, or the identity proves nothing about
// the rope settings being read.
TEST(ConfigFormsTest, YarnChangesTheLogits) {
  EXPECT_FALSE(PromptLogits("qwen3-f32") == PromptLogits("qwen3-yarn"));
}

}  // namespace
}  // namespace specula
