// The engine against the independent NumPy reference (tests/reference/reference_model.py),
// for a tiny random model of every supported family and weight dtype: logits at every prompt
// position within 1e-4 relative error, and identical greedy continuations.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/generate/generator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/generate/forward_helpers.h"

namespace specula {
namespace {

using ::specula::testing::AllTestModels;
using ::specula::testing::ModelParamName;
using ::specula::testing::RelativeError;
using ::specula::testing::SingleSequenceRunner;
using ::specula::testing::TestModelDir;

constexpr int kNewTokens = 12;

const std::vector<int32_t>& Prompt() { return ::specula::testing::ParityPrompt(); }

nlohmann::json RunReference(const std::string& model_dir) {
  const std::string out =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("specula_ref_", std::filesystem::path(model_dir).filename().string(), "_",
                    getpid(), ".json"))
          .string();
  const std::string cmd = absl::StrCat(
      SPECULA_PYTHON3, " ", SPECULA_SOURCE_DIR, "/tests/reference/reference_model.py --model ",
      model_dir, " --prompt-ids ", absl::StrJoin(Prompt(), ","), " --max-new-tokens ",
      kNewTokens, " --out ", out);
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove(out);
  return j;
}

class ReferenceParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceParityTest, PromptLogitsMatchAtEveryPosition) {
  const std::string dir = TestModelDir(GetParam());
  nlohmann::json ref = RunReference(dir);
  ASSERT_TRUE(ref.is_object()) << "reference produced no JSON";
  SingleSequenceRunner runner(dir);
  const int64_t vocab = runner.config().vocab_size;
  std::vector<float> logits = runner.Run(Prompt(), /*all_rows=*/true);
  const auto& rows = ref["all_prompt_logits"];
  ASSERT_EQ(rows.size(), Prompt().size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<double> expected = rows[i].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int64_t>(expected.size()), vocab);
    std::vector<float> got(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    EXPECT_LT(RelativeError(got, expected), 1e-4) << "position " << i;
  }
}

TEST_P(ReferenceParityTest, GreedyContinuationIsIdentical) {
  const std::string dir = TestModelDir(GetParam());
  nlohmann::json ref = RunReference(dir);
  ASSERT_TRUE(ref.is_object());
  auto gen = Generator::Create(dir, GeneratorOptions{}).value();
  GenerationRequest req;
  req.prompt = Prompt();
  req.sampling.temperature = 0;
  req.stopping.max_tokens = kNewTokens;
  req.stopping.ignore_eos = true;
  auto results = gen->GenerateAll({req}).value();
  EXPECT_EQ(results[0].tokens, ref["generated"].get<std::vector<int32_t>>());
}

INSTANTIATE_TEST_SUITE_P(ConfigVariants, ReferenceParityTest,
                         ::testing::ValuesIn(::specula::testing::ConfigVariantModels()),
                         ModelParamName);
INSTANTIATE_TEST_SUITE_P(AllFamilies, ReferenceParityTest, ::testing::ValuesIn(AllTestModels()),
                         ModelParamName);

}  // namespace
}  // namespace specula
