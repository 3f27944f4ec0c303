// Helpers for tests that drive the Transformer directly (below the Generator).
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/step_plan.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/kv_pool.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"

namespace specula::testing {

// The build's test models, or $SPECULA_TEST_MODELS_DIR's where set (a GPU bundle runs the test
// binaries on another machine, away from the build tree).
inline std::string TestModelDir(const std::string& name) {
  const char* moved = std::getenv("SPECULA_TEST_MODELS_DIR");
  return std::string(moved != nullptr ? moved : SPECULA_TEST_MODELS_DIR) + "/" + name;
}

inline const std::vector<std::string>& AllTestModels() {
  static const std::vector<std::string> names = {"llama-f32",   "llama-sharded", "llama3-f32",
                                                 "llama3-bf16", "mistral-f32",   "qwen2-f32",
                                                 "qwen2-f16",   "qwen3-f32",     "qwen3-bf16"};
  return names;
}

// Models that vary one config feature of a family (tests/CMakeLists.txt): biases, yarn rope.
inline const std::vector<std::string>& ConfigVariantModels() {
  static const std::vector<std::string> names = {"llama-bias", "qwen3-bias", "qwen3-yarn"};
  return names;
}

// The prompt the logit comparisons run: 24 ids every tiny test model has.
inline const std::vector<int32_t>& ParityPrompt() {
  static const std::vector<int32_t> p = {1,   72, 101, 108, 108, 111, 44, 32,  119, 111, 114, 108,
                                         100, 33, 32,  84,  104, 101, 32, 113, 117, 105, 99,  107};
  return p;
}

// gtest parameter names may not contain '-' (model names do).
inline std::string GtestSafeName(std::string name) {
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

inline std::string ModelParamName(const ::testing::TestParamInfo<std::string>& info) {
  return GtestSafeName(info.param);
}

// One sequence's KV plus the model, fed chunk by chunk.
class SingleSequenceRunner {
 public:
  explicit SingleSequenceRunner(const std::string& model_dir, int page_size = 4) : backend_(2) {
    model_ = Transformer::Load(model_dir, backend_).value();
    const ModelConfig& c = model_->config();
    KvPoolOptions o{static_cast<int32_t>(c.num_hidden_layers),
                    static_cast<int32_t>(c.num_key_value_heads), static_cast<int32_t>(c.head_dim),
                    page_size, 64};
    pool_ = KvPool::Create(backend_, o).value();
    blocks_ = pool_.Allocate(pool_.num_blocks()).value();
    attention_ = std::make_unique<DenseKvAttention>(
        backend_, pool_, static_cast<int32_t>(c.num_attention_heads), c.softmax_scale());
  }

  const ModelConfig& config() const { return model_->config(); }

  // Runs `tokens` as the next chunk; returns logits of every chunk row ([n, vocab]) or only the
  // last row.
  std::vector<float> Run(const std::vector<int32_t>& tokens, bool all_rows) {
    const int32_t n = static_cast<int32_t>(tokens.size());
    EXPECT_TRUE(model_->Reserve(n, n).ok());
    plan_.Clear();
    std::vector<int32_t> positions, logit_rows;
    for (int32_t i = 0; i < n; ++i) {
      positions.push_back(len_ + i);
      if (all_rows || i == n - 1) logit_rows.push_back(i);
    }
    const DenseSeqRows seq{0, n, len_ + n, blocks_};
    attention_->Plan(absl::MakeConstSpan(&seq, 1), plan_);
    const auto t = plan_.Add<int32_t>(tokens), p = plan_.Add<int32_t>(positions),
               l = plan_.Add<int32_t>(logit_rows);
    EXPECT_TRUE(plan_.Upload().ok());
    attention_->Bind(plan_);
    model_->Forward(plan_.Device(t), plan_.Device(p), *attention_);
    model_->Logits(model_->hidden(n), plan_.Device(l), 0);
    std::vector<float> logits;
    model_->ReadLogits(static_cast<int64_t>(logit_rows.size()), &logits);
    len_ += n;
    return logits;
  }

 private:
  CpuBackend backend_;
  std::unique_ptr<Transformer> model_;
  KvPool pool_;
  std::vector<int32_t> blocks_;
  StepPlan plan_{backend_};
  std::unique_ptr<DenseKvAttention> attention_;
  int32_t len_ = 0;
};

// max |a - b| / max |b|: the relative error used for logits comparisons.
inline double RelativeError(const std::vector<float>& a, const std::vector<double>& b) {
  double max_diff = 0, max_ref = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_diff / max_ref;
}

inline int32_t Argmax(const float* row, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace specula::testing
