// The Generator on the sparse KV cache: invariant 1 (a budget covering the context equals dense,
// for every architecture and speculation mode), small budgets, and that every host page and
// device slot comes back (invariant 3 at the engine level).
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/generate/generator.h"
#include "engine/common/capacity_error.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"

namespace specula {
namespace {

using ::specula::testing::AllTestModels;
using ::specula::testing::Greedy;
using ::specula::testing::GtestSafeName;
using ::specula::testing::PageBoundaryRequests;
using ::specula::testing::TestModelDir;

std::vector<GenerationRequest> Requests() { return PageBoundaryRequests(4); }

GeneratorOptions Options(bool sparse, SpeculationMode mode, MissPolicy miss, int64_t budget) {
  GeneratorOptions o;
  o.prefill_chunk_tokens = 48;  // prompts span several steps, mixed with decode
  o.kv_cache_tokens = 8192;
  o.sparse.enabled = sparse;
  o.sparse.budget_tokens = budget;
  o.sparse.sink_tokens = 16;
  o.sparse.recent_tokens = 32;
  o.sparse.min_context_tokens = 0;
  o.sparse.speculation = mode;
  o.sparse.miss_policy = miss;
  o.sparse.prefetch_extra_tokens = 32;
  o.host_capacity_tokens = 4096;
  return o;
}

// `tolerance` on logprobs: the sparse path reads the same keys in the same order as the dense
// one, so only GEMMs seeing rows in another grouping can move the last bits (0: bit-identical).
void ExpectSameOutput(const GenerationResult& dense, const GenerationResult& sparse,
                      const std::string& what, double tolerance = 1e-6) {
  ASSERT_EQ(dense.tokens, sparse.tokens) << what;
  ASSERT_EQ(dense.logprobs.size(), sparse.logprobs.size()) << what;
  for (size_t t = 0; t < dense.logprobs.size(); ++t) {
    EXPECT_NEAR(dense.logprobs[t].logprob, sparse.logprobs[t].logprob, tolerance)
        << what << " t=" << t;
    ASSERT_EQ(dense.logprobs[t].top.size(), sparse.logprobs[t].top.size());
    for (size_t i = 0; i < dense.logprobs[t].top.size(); ++i) {
      EXPECT_EQ(dense.logprobs[t].top[i].token, sparse.logprobs[t].top[i].token);
      EXPECT_NEAR(dense.logprobs[t].top[i].logprob, sparse.logprobs[t].top[i].logprob, tolerance)
          << what << " t=" << t << " alt " << i;
    }
  }
}

class FullBudgetTest
    : public ::testing::TestWithParam<std::tuple<std::string, SpeculationMode, MissPolicy>> {};

TEST_P(FullBudgetTest, EqualsDense) {
  const auto& [model, mode, miss] = GetParam();
  // 256 tokens cover the longest context (131 + 40): every page is selected. Run alone, each
  // request sees exactly the GEMMs the dense run does (the same prompt chunks, one row per
  // decode step) and attention reads the same keys in the same order: bit-identical logprobs.
  auto dense_gen = Generator::Create(TestModelDir(model), Options(false, mode, miss, 256)).value();
  auto sparse_gen = Generator::Create(TestModelDir(model), Options(true, mode, miss, 256)).value();
  const std::vector<GenerationRequest> requests = Requests();
  for (size_t i = 0; i < requests.size(); ++i) {
    auto dense = dense_gen->GenerateAll({requests[i]}).value();
    auto sparse = sparse_gen->GenerateAll({requests[i]}).value();
    ExpectSameOutput(dense[0], sparse[0], model + " request " + std::to_string(i), 0.0);
  }
  // Batched, the sparse prompts are prefilled layer-major, apart from the batch's other rows: a
  // GEMM sees its rows in other groupings, which may move the last bits, never the tokens.
  auto dense = dense_gen->GenerateAll(requests).value();
  auto sparse = sparse_gen->GenerateAll(requests).value();
  for (size_t i = 0; i < dense.size(); ++i) {
    ExpectSameOutput(dense[i], sparse[i], model + " batched request " + std::to_string(i), 1e-4);
  }
  EXPECT_EQ(sparse_gen->host_pages_used(), 0);
  EXPECT_EQ(sparse_gen->device_slots_used(), 0);
  EXPECT_EQ(sparse_gen->kv_pool().used_blocks(), 0);
}

std::string FullBudgetName(
    const ::testing::TestParamInfo<std::tuple<std::string, SpeculationMode, MissPolicy>>& info) {
  return GtestSafeName(std::get<0>(info.param) + "_" +
                       SpeculationModeName(std::get<1>(info.param)) + "_" +
                       MissPolicyName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    AllArchitectures, FullBudgetTest,
    ::testing::Combine(::testing::ValuesIn(AllTestModels()),
                       ::testing::Values(SpeculationMode::kNone, SpeculationMode::kCrossStep,
                                         SpeculationMode::kCrossLayer, SpeculationMode::kBoth),
                       ::testing::Values(MissPolicy::kDefer, MissPolicy::kFetch)),
    FullBudgetName);

// Under `fetch` the attended pages depend only on the real queries, so a small budget gives the
// same output with or without speculation: a prefetch that corrupted a slot, or a stale copy,
// would show. This runs the prediction paths the full-budget matrix never needs.
TEST(SparseGenerationTest, SpeculationNeverChangesTheOutputUnderFetch) {
  for (const char* model : {"llama3-f32", "qwen3-bf16"}) {
    auto run = [&](SpeculationMode mode) {
      GeneratorOptions o = Options(true, mode, MissPolicy::kFetch, 32);
      o.sparse.prefetch_threads = 2;
      auto gen = Generator::Create(TestModelDir(model), o).value();
      auto out = gen->GenerateAll(Requests()).value();
      EXPECT_EQ(gen->host_pages_used(), 0);
      EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
      return out;
    };
    const auto none = run(SpeculationMode::kNone);
    for (SpeculationMode mode :
         {SpeculationMode::kCrossStep, SpeculationMode::kCrossLayer, SpeculationMode::kBoth}) {
      const auto with = run(mode);
      for (size_t i = 0; i < none.size(); ++i) {
        ExpectSameOutput(
            none[i], with[i],
            std::string(model) + " " + SpeculationModeName(mode) + " request " + std::to_string(i),
            0.0);
      }
    }
  }
}

// miss_policy auto runs fetch on the CPU backend (its memory is the host's), and the generator
// reports the policy that runs. (A GPU's is defer: SparseOptionsTest.AutoDefers...)
TEST(SparseGenerationTest, AutoMissPolicyIsFetchOnTheCpuBackend) {
  GeneratorOptions o = Options(true, SpeculationMode::kCrossStep, MissPolicy::kAuto, 32);
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  EXPECT_EQ(gen->options().sparse.miss_policy, MissPolicy::kFetch);
  EXPECT_EQ(gen->sparse_cache()->options().miss_policy, MissPolicy::kFetch);
}

TEST(SparseGenerationTest, NoSinksNoWindowFullBudgetEqualsDense) {
  GeneratorOptions o = Options(true, SpeculationMode::kBoth, MissPolicy::kFetch, 256);
  o.sparse.sink_tokens = 0;
  o.sparse.recent_tokens = 0;
  auto sparse = Generator::Create(TestModelDir("mistral-f32"), o).value();
  auto dense = Generator::Create(TestModelDir("mistral-f32"),
                                 Options(false, SpeculationMode::kNone, MissPolicy::kFetch, 1))
                   .value();
  for (const GenerationRequest& r : Requests()) {
    ExpectSameOutput(dense->GenerateAll({r}).value()[0], sparse->GenerateAll({r}).value()[0],
                     "request of " + std::to_string(r.prompt.size()), 0.0);
  }
}

// Layer-major prefill (DESIGN.md §3): a step finishes layer 0 over the whole prompt before any of
// layer 1 is computed, and each layer's pages reach the host store once, whole. Token-major
// chunks would instead have written the first chunk's pages of every layer.
TEST(SparseGenerationTest, PrefillIsLayerMajor) {
  GeneratorOptions o = Options(true, SpeculationMode::kCrossStep, MissPolicy::kFetch, 32);
  o.prefill_chunk_tokens = 100;  // 2 layers x 100: one layer's 200 tokens a step
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  ASSERT_EQ(gen->model_config().num_hidden_layers, 2);
  ASSERT_TRUE(gen->Add(Greedy(std::vector<int32_t>(200, 11), 4)).ok());
  const HostKvStore& store = gen->sparse_cache()->store();
  auto written_pages = [&] {
    int64_t n = 0;
    std::vector<char> zero(store.page_bytes(), 0);
    for (int32_t p = 0; p < store.capacity_pages(); ++p) {
      n += std::memcmp(store.Page(p), zero.data(), zero.size()) != 0;
    }
    return n;
  };
  const int64_t kv_heads = gen->model_config().num_key_value_heads;
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(gen->Step(&out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(written_pages(), 13 * kv_heads);  // layer 0's 13 pages (200 tokens), and no more
  // A unit that does not end the prompt is prompt work all the same (the step-kind metrics):
  // one prefilling row, whose tokens count when the prompt is done.
  EXPECT_EQ(gen->last_step().prefill_rows, 1);
  EXPECT_EQ(gen->last_step().prefill_tokens, 0);
  EXPECT_EQ(gen->last_step().decode_rows, 0);
  ASSERT_TRUE(gen->Step(&out).ok());
  ASSERT_EQ(out.size(), 1u);  // the first token, once layer 1 is done
  EXPECT_EQ(written_pages(), 2 * 13 * kv_heads);
  EXPECT_EQ(gen->last_step().prefill_rows, 1);
  EXPECT_EQ(gen->last_step().prefill_tokens, 200);
  ASSERT_TRUE(gen->Step(&out).ok());  // decode alone
  EXPECT_EQ(gen->last_step().prefill_rows, 0);
  EXPECT_EQ(gen->last_step().decode_rows, 1);
}

TEST(SparseGenerationTest, DenseAndSparseRequestsShareABatch) {
  // One request forced dense inside a sparse server: the batch mixes both kinds of rows.
  auto gen = Generator::Create(TestModelDir("qwen3-f32"),
                               Options(true, SpeculationMode::kBoth, MissPolicy::kFetch, 256))
                 .value();
  auto reqs = Requests();
  reqs[1].sparse.mode = SparseMode::kDense;
  auto mixed = gen->GenerateAll(reqs).value();
  auto dense_gen = Generator::Create(TestModelDir("qwen3-f32"),
                                     Options(false, SpeculationMode::kNone, MissPolicy::kFetch, 1))
                       .value();
  auto dense = dense_gen->GenerateAll(Requests()).value();
  for (size_t i = 0; i < dense.size(); ++i) {
    // Mixed batches put the dense request's rows first: a different GEMM row order.
    ExpectSameOutput(dense[i], mixed[i], "request " + std::to_string(i), 1e-4);
  }
}

// Runs requests to the end by hand to see each sequence's final kv_stats.
std::vector<KvStats> RunCollectingStats(Generator& gen, const std::vector<GenerationRequest>& r) {
  std::vector<uint64_t> ids;
  for (const auto& req : r) ids.push_back(gen.Add(req).value());
  std::vector<KvStats> stats(r.size());
  std::vector<SequenceOutput> outs;
  while (gen.HasWork()) {
    outs.clear();
    EXPECT_TRUE(gen.Step(&outs).ok());
    for (const SequenceOutput& o : outs) {
      if (o.finish == FinishReason::kNone) {
        EXPECT_FALSE(o.kv_stats.has_value());
        continue;
      }
      EXPECT_TRUE(o.kv_stats.has_value());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == o.id) stats[i] = *o.kv_stats;
      }
    }
  }
  return stats;
}

TEST(SparseGenerationTest, SmallBudgetCountsHitsAndMissesAndFreesEverything) {
  for (MissPolicy miss : {MissPolicy::kDefer, MissPolicy::kFetch}) {
    auto gen = Generator::Create(TestModelDir("llama3-f32"),
                                 Options(true, SpeculationMode::kCrossStep, miss, 32))
                   .value();
    auto reqs = Requests();
    const std::vector<KvStats> stats = RunCollectingStats(*gen, reqs);
    // The 131-token prompt has candidates beyond the 2-page budget: pages are selected, and
    // every selection is a hit or a miss.
    const KvStats& s = stats[2];
    EXPECT_TRUE(s.sparse);
    EXPECT_EQ(s.budget_tokens, 32);
    EXPECT_GT(s.pages_hit + s.pages_missed, 0);
    EXPECT_GE(s.hit_rate(), 0.0);
    EXPECT_LE(s.hit_rate(), 1.0);
    EXPECT_GE(s.stall_seconds, 0.0);
    EXPECT_EQ(gen->host_pages_used(), 0);
    EXPECT_EQ(gen->device_slots_used(), 0);
    EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  }
}

// cross_layer through the model itself: the transformer's early query of layer l+1
// (EarlyQueryRows, PredictLayer) stages pages while layer l runs. Against no speculation on the
// same requests, it copies more ahead of need and those pages are found when attention needs
// them: more hits (or late pages, still in flight) and fewer misses. Break the early query or
// drop the prediction and the counts fall back to speculation none's.
TEST(SparseGenerationTest, CrossLayerPredictionsFromTheModelAreLaterHits) {
  auto total = [](SpeculationMode mode) {
    auto gen = Generator::Create(TestModelDir("llama3-f32"),
                                 Options(true, mode, MissPolicy::kFetch, 32))
                   .value();
    KvStats sum;
    for (const KvStats& s : RunCollectingStats(*gen, Requests())) {
      sum.pages_hit += s.pages_hit;
      sum.pages_late += s.pages_late;
      sum.pages_missed += s.pages_missed;
      sum.bytes_prefetched += s.bytes_prefetched;
    }
    return sum;
  };
  const KvStats none = total(SpeculationMode::kNone);
  const KvStats cross_layer = total(SpeculationMode::kCrossLayer);
  ASSERT_GT(none.pages_missed, 0);  // there is something to predict
  EXPECT_GT(cross_layer.bytes_prefetched, none.bytes_prefetched);
  EXPECT_GT(cross_layer.pages_hit + cross_layer.pages_late, none.pages_hit + none.pages_late);
  EXPECT_LT(cross_layer.pages_missed, none.pages_missed);
  std::cout << "none: hit " << none.pages_hit << " late " << none.pages_late << " missed "
            << none.pages_missed << "; cross_layer: hit " << cross_layer.pages_hit << " late "
            << cross_layer.pages_late << " missed " << cross_layer.pages_missed << "\n";
}

TEST(SparseGenerationTest, DenseRequestsReportNotSparse) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"),
                               Options(true, SpeculationMode::kCrossStep, MissPolicy::kFetch, 32))
                 .value();
  auto reqs = Requests();
  for (auto& r : reqs) r.sparse.mode = SparseMode::kDense;
  for (const KvStats& s : RunCollectingStats(*gen, reqs)) {
    EXPECT_FALSE(s.sparse);
    EXPECT_EQ(s.pages_hit + s.pages_missed, 0);
  }
}

TEST(SparseGenerationTest, CancelReturnsHostPagesAndSlots) {
  GeneratorOptions o = Options(true, SpeculationMode::kBoth, MissPolicy::kFetch, 32);
  o.prefill_chunk_tokens = 16;
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  std::vector<uint64_t> ids;
  for (const auto& r : Requests()) ids.push_back(gen->Add(r).value());
  EXPECT_GT(gen->host_pages_used(), 0);
  EXPECT_GT(gen->device_slots_used(), 0);
  std::vector<SequenceOutput> outs;
  // 16 prompt tokens a step: after 6 steps the 5-token prompt decodes, the 64-token one has
  // just finished prefill and the 131-token one is mid-prefill.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(gen->Step(&outs).ok());
  for (uint64_t id : ids) {
    SequenceOutput out;
    ASSERT_TRUE(gen->Cancel(id, &out).ok());
    ASSERT_TRUE(out.kv_stats.has_value());
    EXPECT_TRUE(out.kv_stats->sparse);
  }
  EXPECT_EQ(gen->host_pages_used(), 0);
  EXPECT_EQ(gen->device_slots_used(), 0);
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

TEST(SparseGenerationTest, MinContextChoosesDenseOrSparse) {
  GeneratorOptions o = Options(true, SpeculationMode::kCrossStep, MissPolicy::kFetch, 32);
  o.sparse.min_context_tokens = 100;
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  auto reqs = Requests();  // 5 + 40, 64 + 40, 131 + 40 tokens
  EXPECT_FALSE(gen->UsesSparse(reqs[0]));
  EXPECT_TRUE(gen->UsesSparse(reqs[1]));
  EXPECT_TRUE(gen->UsesSparse(reqs[2]));
  reqs[2].sparse.mode = SparseMode::kDense;
  EXPECT_FALSE(gen->UsesSparse(reqs[2]));
  reqs[0].sparse.mode = SparseMode::kSparse;
  EXPECT_TRUE(gen->UsesSparse(reqs[0]));
}

TEST(SparseGenerationTest, BadSparseRequestsAreRejected) {
  auto dense_only = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  GenerationRequest r = Greedy({1, 2, 3}, 4);
  r.sparse.mode = SparseMode::kSparse;
  EXPECT_EQ(dense_only->Validate(r).code(), absl::StatusCode::kFailedPrecondition);
  r.sparse.mode = SparseMode::kDefault;
  r.sparse.budget_tokens = 64;
  EXPECT_EQ(dense_only->Validate(r).code(), absl::StatusCode::kFailedPrecondition);

  auto gen = Generator::Create(TestModelDir("llama3-f32"),
                               Options(true, SpeculationMode::kCrossStep, MissPolicy::kFetch, 32))
                 .value();
  r.sparse.budget_tokens = -1;
  EXPECT_EQ(gen->Validate(r).code(), absl::StatusCode::kInvalidArgument);
  r.sparse.mode = SparseMode::kDense;
  r.sparse.budget_tokens = 64;
  EXPECT_EQ(gen->Validate(r).code(), absl::StatusCode::kInvalidArgument);
  // More than the host store holds can never run.
  GeneratorOptions small = Options(true, SpeculationMode::kCrossStep, MissPolicy::kFetch, 32);
  small.host_capacity_tokens = 1024;
  auto small_gen = Generator::Create(TestModelDir("llama3-f32"), small).value();
  GenerationRequest big = Greedy(std::vector<int32_t>(1000, 7), 200);
  big.sparse.mode = SparseMode::kSparse;
  const absl::Status s = small_gen->Validate(big);
  EXPECT_TRUE(IsNeverFits(s)) << s;
  EXPECT_NE(s.message().find("host_capacity_tokens"), std::string::npos) << s;
}

// kv_cache.host_capacity_tokens: -1 gives sparse.enabled its default store and a dense-only
// engine none; sparse.enabled with none (0), or a value out of range, fails naming the key.
TEST(SparseGenerationTest, TheHostStoreIsSizedByKvCacheHostCapacityTokens) {
  GeneratorOptions o = Options(true, SpeculationMode::kNone, MissPolicy::kFetch, 32);
  o.host_capacity_tokens = -1;
  auto sparse = Generator::Create(TestModelDir("llama3-f32"), o).value();
  const ModelConfig& c = sparse->model_config();
  EXPECT_EQ(sparse->host_pages_capacity(), GeneratorOptions::kDefaultHostCapacityTokens /
                                               o.page_size * c.num_hidden_layers *
                                               c.num_key_value_heads);
  o.sparse.enabled = false;
  auto dense = Generator::Create(TestModelDir("llama3-f32"), o).value();
  EXPECT_EQ(dense->host_store(), nullptr);
  EXPECT_EQ(dense->host_pages_capacity(), 0);
  o.host_capacity_tokens = 512;
  EXPECT_EQ(Generator::Create(TestModelDir("llama3-f32"), o).value()->host_pages_capacity(),
            512 / o.page_size * c.num_hidden_layers * c.num_key_value_heads);
  for (int64_t bad : {int64_t{0}, int64_t{-2}, (int64_t{1} << 30) + 1}) {
    o.sparse.enabled = bad == 0;
    o.host_capacity_tokens = bad;
    const absl::Status s = Generator::Create(TestModelDir("llama3-f32"), o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("kv_cache.host_capacity_tokens"), std::string::npos) << s;
  }
}

TEST(SparseGenerationTest, FullHostStoreIsResourceExhaustedAtAdmission) {
  GeneratorOptions o = Options(true, SpeculationMode::kNone, MissPolicy::kFetch, 32);
  o.host_capacity_tokens = 256;
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  GenerationRequest r = Greedy(std::vector<int32_t>(150, 9), 50);  // 200 of 256 tokens
  ASSERT_TRUE(gen->Add(r).ok());
  const int64_t host = gen->host_pages_used();
  const int32_t blocks = gen->kv_pool().used_blocks();
  EXPECT_FALSE(gen->HasRoomFor(r));
  EXPECT_EQ(gen->Add(r).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gen->host_pages_used(), host);  // nothing taken by the failed admission
  EXPECT_EQ(gen->kv_pool().used_blocks(), blocks);
}

TEST(SparseGenerationTest, FullDevicePoolIsResourceExhaustedAndKeepsNoHostPages) {
  // Host room for many requests, device room for one working set.
  GeneratorOptions o = Options(true, SpeculationMode::kNone, MissPolicy::kFetch, 32);
  o.kv_cache_tokens = 10 * 16;  // a working set takes 1 + 3 + 2 + 1 = 7 blocks
  auto gen = Generator::Create(TestModelDir("llama3-f32"), o).value();
  GenerationRequest r = Greedy(std::vector<int32_t>(300, 9), 20);
  r.sparse.mode = SparseMode::kSparse;
  ASSERT_TRUE(gen->Add(r).ok());
  const int64_t host = gen->host_pages_used();
  EXPECT_FALSE(gen->HasRoomFor(r));
  EXPECT_EQ(gen->Add(r).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(gen->host_pages_used(), host);
}

TEST(SparseGenerationTest, WorkingSetIsSizedToTheRequest) {
  // A short request does not hold the full budget's slots: no more than it can have candidates.
  auto gen = Generator::Create(TestModelDir("llama3-f32"),
                               Options(true, SpeculationMode::kNone, MissPolicy::kFetch, 1024))
                 .value();
  GenerationRequest r = Greedy(std::vector<int32_t>(40, 9), 8);  // 3 pages
  r.sparse.mode = SparseMode::kSparse;
  ASSERT_TRUE(gen->Add(r).ok());
  // 1 sink + (2 window + 1) ring pages, and no cache slot: 3 pages leave no candidate.
  EXPECT_EQ(gen->kv_pool().used_blocks(), 4);
}

}  // namespace
}  // namespace specula
