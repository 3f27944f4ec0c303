// Generation on the CUDA backend against the CPU reference, end to end through the Generator:
// greedy tokens on the tiny models with bf16 checkpoints (both backends then multiply by the same
// weights; only the GPU's bf16 rounding of GEMM inputs differs), dense and sparse at a full
// budget, every speculation mode. Skips when no GPU is visible.
#include <string>
#include <tuple>
#include <vector>

#include "engine/generate/generator.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"

namespace specula {
namespace {

using ::specula::testing::PageBoundaryRequests;
using ::specula::testing::TestModelDir;

GeneratorOptions Options(const std::string& device, bool sparse, SpeculationMode mode) {
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
  o.sparse.host_capacity_tokens = 4096;
  return o;
}

class CudaGenerateTest
    : public ::testing::TestWithParam<std::tuple<std::string, bool, SpeculationMode>> {};

TEST_P(CudaGenerateTest, GreedyTokensEqualTheCpu) {
  const auto& [model, sparse, mode] = GetParam();
  auto gpu = Generator::Create(TestModelDir(model), Options("cuda", sparse, mode));
  if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status();
  ASSERT_EQ((*gpu)->backend_name(), "cuda");
  auto cpu = Generator::Create(TestModelDir(model), Options("cpu", false, mode)).value();
  const auto want = cpu->GenerateAll(PageBoundaryRequests(0)).value();
  const auto got = (*gpu)->GenerateAll(PageBoundaryRequests(0)).value();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].tokens, got[i].tokens) << model << " request " << i;
  }
  EXPECT_EQ((*gpu)->host_pages_used(), 0);
  EXPECT_EQ((*gpu)->device_slots_used(), 0);
  EXPECT_EQ((*gpu)->kv_pool().used_blocks(), 0);
}

std::string Name(
    const ::testing::TestParamInfo<std::tuple<std::string, bool, SpeculationMode>>& info) {
  std::string name = std::get<0>(info.param) + (std::get<1>(info.param) ? "_sparse_" : "_dense_") +
                     SpeculationModeName(std::get<2>(info.param));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
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
