// Incremental decoding with the KV cache must give what recomputing the whole sequence gives,
// and chunked prefill must equal one-shot prefill, for every family.
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"

namespace specula {
namespace {

using ::specula::testing::AllTestModels;
using ::specula::testing::ModelParamName;
using ::specula::testing::Argmax;
using ::specula::testing::RelativeError;
using ::specula::testing::SingleSequenceRunner;
using ::specula::testing::TestModelDir;

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

class DecodeConsistencyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeConsistencyTest, DecodeWithCacheEqualsRecomputeAtEveryStep) {
  const std::string dir = TestModelDir(GetParam());
  SingleSequenceRunner incremental(dir);
  const int64_t vocab = incremental.config().vocab_size;
  std::vector<int32_t> seq = {1, 40, 50, 60, 70, 80, 90};
  std::vector<float> logits = incremental.Run(seq, /*all_rows=*/false);
  for (int step = 0; step < 10; ++step) {
    SingleSequenceRunner fresh(dir);
    std::vector<float> recomputed = fresh.Run(seq, /*all_rows=*/false);
    ASSERT_LT(RelativeError(logits, ToDouble(recomputed)), 1e-5) << "step " << step;
    const int32_t next = Argmax(logits.data(), vocab);
    seq.push_back(next);
    logits = incremental.Run({next}, /*all_rows=*/false);
  }
}

TEST_P(DecodeConsistencyTest, ChunkedPrefillEqualsOneShot) {
  const std::string dir = TestModelDir(GetParam());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back(3 + (i * 37) % 250);
  SingleSequenceRunner whole(dir);
  std::vector<float> expected = whole.Run(prompt, /*all_rows=*/false);
  for (size_t chunk : {1u, 3u, 5u, 16u}) {
    SingleSequenceRunner chunked(dir);
    std::vector<float> last;
    for (size_t i = 0; i < prompt.size(); i += chunk) {
      std::vector<int32_t> part(prompt.begin() + i,
                                prompt.begin() + std::min(prompt.size(), i + chunk));
      last = chunked.Run(part, /*all_rows=*/false);
    }
    EXPECT_LT(RelativeError(last, ToDouble(expected)), 1e-5) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, DecodeConsistencyTest, ::testing::ValuesIn(AllTestModels()),
                         ModelParamName);

}  // namespace
}  // namespace specula
