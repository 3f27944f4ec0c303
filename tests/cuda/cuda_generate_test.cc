// Generation on the CUDA backend against the CPU reference, end to end through the Generator, on
// the tiny models with bf16 checkpoints (both backends then multiply by the same weights; only
// the GPU's bf16 rounding of GEMM inputs, about 2^-9 relative, and summation order differ), dense
// and sparse at a full budget, under each speculation mode. Skips when no GPU is visible.
//
// The greedy paths must agree token by token with the chosen tokens' logprobs within 0.05; where
// they part, the CPU's choice must have been a near tie (its top two within 0.1 nats), the only
// place that rounding may flip a greedy choice; the rest of that request is not compared.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/common/status_macros.h"
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

// Decode steps replayed as CUDA graphs (model.cuda_graphs) give the same bytes as the same steps
// launched kernel by kernel: four seeded, sampled requests with logprobs, whose batch shrinks as
// they finish (rows 4, 3, 2, 1) and whose longest context crosses a keys-capacity boundary
// (256 -> 512) mid-generation, run with graphs on and off: identical tokens and logprobs, and
// with graphs on, most decode steps replayed (each shape is recorded on its first step).
struct GraphRun {
  std::map<uint64_t, GenerationResult> results;  // by sequence id, in order of Add
  int decode_steps = 0;
  int replayed = 0;
};

absl::StatusOr<GraphRun> RunWithGraphs(bool graphs, bool dependent_launches = true) {
  GeneratorOptions o = Options(DeviceKind::kCuda, false, SpeculationMode::kNone);
  o.cuda_graphs = graphs;
  o.dependent_launches = dependent_launches;
  ASSIGN_OR_RETURN(std::unique_ptr<Generator> gen,
                   Generator::Create(TestModelDir("llama3-bf16"), o));
  if (gen->backend_name() != "cuda") return absl::UnavailableError("no CUDA backend");
  const std::vector<std::pair<int, int>> shapes = {{230, 70}, {200, 50}, {40, 30}, {90, 12}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    GenerationRequest r;
    for (int j = 0; j < shapes[i].first; ++j) r.prompt.push_back(1 + (j * 37 + 11 * i) % 300);
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1000 + i;
    r.sampling.logprobs = 3;
    r.stopping.max_tokens = shapes[i].second;
    r.stopping.ignore_eos = true;
    RETURN_IF_ERROR(gen->Add(r).status());
  }
  GraphRun run;
  std::vector<SequenceOutput> outputs;
  while (gen->HasWork()) {
    outputs.clear();
    RETURN_IF_ERROR(gen->Step(&outputs));
    for (const SequenceOutput& out : outputs) {
      RETURN_IF_ERROR(out.error);
      GenerationResult& r = run.results[out.id];
      r.tokens.insert(r.tokens.end(), out.tokens.begin(), out.tokens.end());
      r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    }
    const StepStats& step = gen->last_step();
    if (step.prefill_tokens == 0 && step.decode_rows > 0) ++run.decode_steps;
    run.replayed += step.replayed ? 1 : 0;
  }
  return run;
}

// Identical tokens, logprobs and alternatives, request by request.
void ExpectSameResults(const GraphRun& a_run, const GraphRun& b_run) {
  ASSERT_EQ(a_run.results.size(), b_run.results.size());
  auto b = b_run.results.cbegin();
  for (auto a = a_run.results.cbegin(); a != a_run.results.cend(); ++a, ++b) {
    EXPECT_EQ(a->second.tokens, b->second.tokens) << "request " << a->first;
    ASSERT_EQ(a->second.logprobs.size(), b->second.logprobs.size());
    for (size_t t = 0; t < a->second.logprobs.size(); ++t) {
      const SampledToken& x = a->second.logprobs[t];
      const SampledToken& y = b->second.logprobs[t];
      EXPECT_EQ(x.logprob, y.logprob) << "request " << a->first << " token " << t;
      ASSERT_EQ(x.top.size(), y.top.size());
      for (size_t k = 0; k < x.top.size(); ++k) {
        EXPECT_EQ(x.top[k].token, y.top[k].token);
        EXPECT_EQ(x.top[k].logprob, y.top[k].logprob);
      }
    }
  }
}

TEST(CudaGraphTest, ReplayedDecodeStepsEqualLaunchedOnes) {
  absl::StatusOr<GraphRun> launched = RunWithGraphs(false);
  if (!launched.ok()) GTEST_SKIP() << "no GPU: " << launched.status();
  const GraphRun replayed = RunWithGraphs(true).value();
  EXPECT_EQ(launched->replayed, 0);
  // Recorded: one step per (rows, capacity) shape, a handful; the other decode steps replay.
  EXPECT_GT(replayed.replayed, replayed.decode_steps - 8) << replayed.decode_steps;
  ExpectSameResults(*launched, replayed);
}

// Kernels launched while the one ahead runs (model.dependent_launches, the default) give the bytes
// of kernels launched after it, eager and replayed: each waits for its inputs, and the few-row
// GEMM's reduction has a fixed order. The run's rows fall from 4 to 1, so the one-row and few-row
// GEMMs both run.
TEST(CudaGraphTest, DependentLaunchesGiveTheBytesOfOrdinaryOnes) {
  absl::StatusOr<GraphRun> ordinary = RunWithGraphs(true, /*dependent_launches=*/false);
  if (!ordinary.ok()) GTEST_SKIP() << "no GPU: " << ordinary.status();
  ExpectSameResults(*ordinary, RunWithGraphs(true).value());
  ExpectSameResults(*ordinary, RunWithGraphs(false).value());
}

}  // namespace
}  // namespace specula
