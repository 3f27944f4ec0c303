// Generation on the CUDA backend against the CPU reference, end to end through the Generator, on
// the tiny models with bf16 checkpoints (both backends then multiply by the same weights; only
// the GPU's bf16 rounding of GEMM inputs, about 2^-9 relative, and summation order differ), dense
// and sparse at a full budget, under each speculation mode. Skips when no GPU is visible.
//
// The greedy paths must agree token by token with the chosen tokens' logprobs within 0.05; where
// they part, the CPU's choice must have been a near tie (its top two within 0.1 nats), the only
// place that rounding may flip a greedy choice; the rest of that request is not compared.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "engine/generate/generator.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"

namespace specula {
namespace {

using ::specula::testing::GtestSafeName;
using ::specula::testing::PageBoundaryRequests;
using ::specula::testing::TestModelDir;

GeneratorOptions Options(DeviceKind device, bool sparse, SpeculationMode mode) {
  GeneratorOptions o;
  o.device = device;
  o.threads = 2;
  o.kv_dtype = "f32";  // the same KV bytes on both backends
  o.prefill_chunk_tokens = 48;
  o.kv_cache_tokens = 8192;
  o.sparse.enabled = sparse;
  o.sparse.budget_tokens = 256;  // covers the longest context: every page is selected
  o.sparse.sink_tokens = 16;
  o.sparse.recent_tokens = 32;
  o.sparse.min_context_tokens = 0;
  o.sparse.speculation = mode;
  o.sparse.prefetch_extra_tokens = 32;
  o.host_capacity_tokens = 4096;
  return o;
}

class CudaGenerateTest
    : public ::testing::TestWithParam<std::tuple<std::string, bool, SpeculationMode>> {};

TEST_P(CudaGenerateTest, GreedyTokensEqualTheCpu) {
  const auto& [model, sparse, mode] = GetParam();
  auto gpu = Generator::Create(TestModelDir(model), Options(DeviceKind::kCuda, sparse, mode));
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status();
  ASSERT_EQ((*gpu)->backend_name(), "cuda");
  auto cpu = Generator::Create(TestModelDir(model), Options(DeviceKind::kCpu, false, mode)).value();
  const auto want = cpu->GenerateAll(PageBoundaryRequests(2)).value();
  const auto got = (*gpu)->GenerateAll(PageBoundaryRequests(2)).value();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].tokens.size(), want[i].logprobs.size());
    ASSERT_EQ(got[i].tokens.size(), got[i].logprobs.size());
    const size_t n = std::min(want[i].tokens.size(), got[i].tokens.size());
    size_t t = 0;
    for (; t < n && want[i].tokens[t] == got[i].tokens[t]; ++t) {
      EXPECT_NEAR(want[i].logprobs[t].logprob, got[i].logprobs[t].logprob, 0.05)
          << model << " request " << i << " token " << t;
    }
    if (t == n) {
      EXPECT_EQ(want[i].tokens.size(), got[i].tokens.size()) << model << " request " << i;
      continue;
    }
    const std::vector<TokenLogprob>& top = want[i].logprobs[t].top;
    ASSERT_GE(top.size(), 2u);
    EXPECT_LT(top[0].logprob - top[1].logprob, 0.1)
        << model << " request " << i << ": the GPU chose " << got[i].tokens[t] << " over "
        << want[i].tokens[t] << " at token " << t << ", which was no near tie";
  }
  EXPECT_EQ((*gpu)->host_pages_used(), 0);
  EXPECT_EQ((*gpu)->device_slots_used(), 0);
  EXPECT_EQ((*gpu)->kv_pool().used_blocks(), 0);
}

std::string Name(
    const ::testing::TestParamInfo<std::tuple<std::string, bool, SpeculationMode>>& info) {
  return GtestSafeName(std::get<0>(info.param) +
                       (std::get<1>(info.param) ? "_sparse_" : "_dense_") +
                       SpeculationModeName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Bf16Models, CudaGenerateTest,
    ::testing::Combine(::testing::Values("llama3-bf16", "qwen3-bf16", "llama-sharded"),
                       ::testing::Values(false, true),
                       ::testing::Values(SpeculationMode::kNone, SpeculationMode::kCrossStep,
                                         SpeculationMode::kCrossLayer)),
    Name);

}  // namespace
}  // namespace specula
