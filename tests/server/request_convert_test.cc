// The proto <-> engine conversions of the sparse KV cache fields: GenerateRequest.sparse in,
// GenerateResponse.kv_stats out.
#include "server/request_convert.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

class RequestConvertTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::FromDirectory(std::string(SPECULA_TEST_MODELS_DIR) + "/llama3-f32");
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t).release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }

  static absl::StatusOr<EngineRequest> Convert(const v1::GenerateRequest& r) {
    TotalTokenLimits limits;
    limits.dense = 4096;
    return ToEngineRequest(r, *tokenizer_, /*default_max_tokens=*/16, limits);
  }

  static v1::GenerateRequest Ids() {
    v1::GenerateRequest r;
    r.mutable_prompt_token_ids()->add_ids(1);
    r.mutable_prompt_token_ids()->add_ids(2);
    return r;
  }

  static inline Tokenizer* tokenizer_ = nullptr;
};

TEST_F(RequestConvertTest, UnsetSparseIsTheServerDefault) {
  absl::StatusOr<EngineRequest> got = Convert(Ids());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->generation.sparse.mode, SparseMode::kDefault);
  EXPECT_EQ(got->generation.sparse.budget_tokens, 0);
}

TEST_F(RequestConvertTest, SparseModesAndBudgetMapThrough) {
  struct Case {
    v1::SparseMode mode;
    SparseMode want;
  };
  for (const Case& c : {Case{v1::SPARSE_MODE_DEFAULT, SparseMode::kDefault},
                        Case{v1::SPARSE_MODE_DENSE, SparseMode::kDense},
                        Case{v1::SPARSE_MODE_SPARSE, SparseMode::kSparse}}) {
    v1::GenerateRequest r = Ids();
    r.mutable_sparse()->set_mode(c.mode);
    r.mutable_sparse()->set_budget_tokens(4000000000u);  // beyond int32: kept exactly
    absl::StatusOr<EngineRequest> got = Convert(r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->generation.sparse.mode, c.want) << v1::SparseMode_Name(c.mode);
    // Whether a budget fits the mode is the engine's call (Generator::Validate), not the
    // converter's.
    EXPECT_EQ(got->generation.sparse.budget_tokens, 4000000000) << v1::SparseMode_Name(c.mode);
  }
}

TEST_F(RequestConvertTest, UnknownSparseModeIsInvalidArgumentNamingTheField) {
  v1::GenerateRequest r = Ids();
  // What a newer client's enum value looks like to this server (proto3 enums are open).
  r.mutable_sparse()->set_mode(static_cast<v1::SparseMode>(7));
  absl::StatusOr<EngineRequest> got = Convert(r);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("sparse.mode = 7"));
}

// Without max_tokens, the default output length is cut to what fits where the request's KV
// lives: the device KV cache when it runs dense, the host store when it runs sparse.
TEST_F(RequestConvertTest, DefaultMaxTokensFitsThePathTheRequestRunsOn) {
  TotalTokenLimits limits;
  limits.dense = 100;
  limits.sparse = 1000;
  // Sparse at 500 tokens and more (like sparse.min_context_tokens), unless asked for dense.
  limits.uses_sparse = [](const GenerationRequest& r) {
    if (r.sparse.mode != SparseMode::kDefault) return r.sparse.mode == SparseMode::kSparse;
    return r.prompt.size() + r.stopping.max_tokens >= 500;
  };
  auto max_tokens = [&](int prompt_tokens, v1::SparseMode mode) {
    v1::GenerateRequest r;
    for (int i = 0; i < prompt_tokens; ++i) r.mutable_prompt_token_ids()->add_ids(1);
    r.mutable_sparse()->set_mode(mode);
    absl::StatusOr<EngineRequest> got =
        ToEngineRequest(r, *tokenizer_, /*default_max_tokens=*/64, limits);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? got->generation.stopping.max_tokens : -1;
  };
  // Short and dense: the device cache's room.
  EXPECT_EQ(max_tokens(50, v1::SPARSE_MODE_DEFAULT), 50);
  EXPECT_EQ(max_tokens(10, v1::SPARSE_MODE_DEFAULT), 64);
  // Long enough to run sparse: the host store's room, not 1 token for a prompt beyond the device
  // cache.
  EXPECT_EQ(max_tokens(600, v1::SPARSE_MODE_DEFAULT), 64);
  EXPECT_EQ(max_tokens(980, v1::SPARSE_MODE_DEFAULT), 20);
  EXPECT_EQ(max_tokens(50, v1::SPARSE_MODE_SPARSE), 64);
  // Dense on request: the device cache, however long.
  EXPECT_EQ(max_tokens(99, v1::SPARSE_MODE_DENSE), 1);
  // A server without a sparse cache: the device cache only.
  limits.sparse = 0;
  EXPECT_EQ(max_tokens(99, v1::SPARSE_MODE_DEFAULT), 1);
}

// One rule for a request that names no length (every API goes through here): up to the room the
// prompt leaves, capped only by the operator's keys.
TEST_F(RequestConvertTest, WithoutMaxTokensARequestMayFillTheRemainingContext) {
  TotalTokenLimits limits;
  limits.dense = 4096;
  auto convert = [&](int prompt_tokens, int32_t default_max_tokens) {
    v1::GenerateRequest r;
    for (int i = 0; i < prompt_tokens; ++i) r.mutable_prompt_token_ids()->add_ids(1);
    return ToEngineRequest(r, *tokenizer_, default_max_tokens, limits);
  };
  EXPECT_EQ(convert(2, 0)->generation.stopping.max_tokens, 4094);     // no cap: all the room
  EXPECT_EQ(convert(4095, 0)->generation.stopping.max_tokens, 1);     // once refused with 16
  EXPECT_EQ(convert(2, 256)->generation.stopping.max_tokens, 256);    // the operator's cap
  EXPECT_EQ(convert(4000, 256)->generation.stopping.max_tokens, 96);  // cut to the room
  limits.max_output_tokens = 100;  // server.limits.max_tokens caps it too
  EXPECT_EQ(convert(2, 0)->generation.stopping.max_tokens, 100);
  EXPECT_EQ(convert(2, 50)->generation.stopping.max_tokens, 50);
  // No room at all: 1, for the engine to refuse naming the limit the prompt hit.
  EXPECT_EQ(convert(4096, 0)->generation.stopping.max_tokens, 1);
}

TEST_F(RequestConvertTest, FinalResponseCarriesKvStats) {
  StreamChunk chunk;
  chunk.tokens = {5};
  chunk.text = "x";
  chunk.done = true;
  chunk.finish = FinishReason::kLength;
  chunk.prompt_tokens = 3;
  chunk.completion_tokens = 9;
  KvStats k;
  k.sparse = true;
  k.budget_tokens = 32;
  k.pages_hit = 30;
  k.pages_missed = 6;
  k.pages_late = 4;
  k.bytes_prefetched = 1 << 20;
  k.bytes_fetched = 81920;
  k.stall_seconds = 0.125;
  chunk.kv_stats = k;
  v1::GenerateResponse res;
  FillResponse(chunk, "req-1", &res);
  ASSERT_TRUE(res.has_kv_stats());
  const v1::KvStats& got = res.kv_stats();
  EXPECT_TRUE(got.sparse());
  EXPECT_EQ(got.budget_tokens(), 32u);
  EXPECT_EQ(got.pages_hit(), 30u);
  EXPECT_EQ(got.pages_missed(), 6u);
  EXPECT_EQ(got.pages_late(), 4u);
  EXPECT_EQ(got.bytes_prefetched(), 1u << 20);
  EXPECT_EQ(got.bytes_fetched(), 81920u);
  EXPECT_EQ(got.stall_seconds(), 0.125);
  EXPECT_DOUBLE_EQ(got.hit_rate(), 0.75);  // 30 / (30 + 6 + 4): late pages are not hits
  EXPECT_EQ(res.finish_reason(), v1::LENGTH);

  // A dense request: present (the client learns it ran dense), counters 0, hit_rate 1.
  chunk.kv_stats = KvStats();
  res.Clear();
  FillResponse(chunk, "req-1", &res);
  ASSERT_TRUE(res.has_kv_stats());
  EXPECT_FALSE(res.kv_stats().sparse());
  EXPECT_EQ(res.kv_stats().pages_hit() + res.kv_stats().pages_missed(), 0u);
  EXPECT_EQ(res.kv_stats().hit_rate(), 1);
}

TEST_F(RequestConvertTest, KvStatsOnlyOnTheFinalResponse) {
  StreamChunk chunk;
  chunk.tokens = {5};
  chunk.text = "x";
  v1::GenerateResponse res;
  FillResponse(chunk, "req-1", &res);
  EXPECT_FALSE(res.has_kv_stats());
  EXPECT_FALSE(res.has_usage());
  // A stream that ends without stats (never admitted) has none either.
  chunk.done = true;
  chunk.finish = FinishReason::kStop;
  res.Clear();
  FillResponse(chunk, "req-1", &res);
  EXPECT_FALSE(res.has_kv_stats());
  EXPECT_TRUE(res.has_usage());
}

}  // namespace
}  // namespace specula
