// Sampling on the GPU (kernels/sampling.cu) against the CPU reference (engine/sampling/
// row_sampling.h) through both backends' SampleRows: the same logits and uniforms must give the
// same token on both, for greedy and every truncation, over vocabularies from 1 to Qwen's, flat,
// peaked and heavily tied logits. Skips where no GPU is visible.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend_factory.h"
#include "engine/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_backend.h"
#include "tests/engine/cpu/mask_logits_case.h"

namespace specula {
namespace {

// The sampling settings every logits case is tried with (temperature, top_k, top_p, min_p,
// logprobs); the uniforms come from a generator, plus the two ends.
std::vector<RowSampling> Settings() {
  const std::vector<RowSampling> base = {
      {0.0f, 0, 1.0f, 0.0f, -1},     {0.0f, 0, 1.0f, 0.0f, 20},   {0.7f, 0, 1.0f, 0.0f, -1},
      {1.3f, 0, 1.0f, 0.0f, 5},      {1.0f, 0, 1.0f, 0.1f, 0},    {1.0f, 1, 1.0f, 0.0f, -1},
      {0.8f, 40, 1.0f, 0.0f, 0},     {1.0f, 1000, 1.0f, 0.0f, 3}, {1.0f, 0, 0.9f, 0.0f, -1},
      {0.6f, 0, 0.3f, 0.0f, 3},      {1.0f, 0, 0.95f, 0.02f, 1},  {0.9f, 50, 0.8f, 0.05f, 20},
      {2.0f, 7, 1.0f, 0.0f, -1},     {1.0f, 0, 0.999f, 0.0f, -1}, {0.5f, 0, 1.0f, 0.5f, -1},
      {1.0f, 100000, 0.5f, 0.0f, 2},
  };
  std::mt19937_64 rng(2026);
  std::vector<RowSampling> out;
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (RowSampling s : base) {
      s.uniform = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      out.push_back(s);
    }
  }
  out[2].uniform = 0.0;
  out[3].uniform = 1.0 - 0x1.0p-53;
  out[8].uniform = 1.0 - 0x1.0p-53;
  out[9].uniform = 0.0;
  return out;
}

enum class Shape { kNormal, kPeaked, kTied, kConstant, kOffset };

std::vector<float> Logits(Shape shape, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) {
    const float z = normal(rng);
    switch (shape) {
      case Shape::kNormal:
        x = z;
        break;
      case Shape::kPeaked:
        x = 4.0f * z;
        break;
      case Shape::kTied:  // a few distinct values, thousands of tokens each
        x = std::round(1.5f * z);
        break;
      case Shape::kConstant:
        x = 0.25f;
        break;
      case Shape::kOffset:  // large logits: exp without the max shift would overflow
        x = 1000.0f + 2.0f * z;
        break;
    }
  }
  return v;
}

class CudaSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpu = testing::CreateCudaBackend();
    if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status();
    gpu_ = std::move(*gpu);
  }

  // SampleRows on `backend` over `logits` ([rows, vocab], stored with a padded row stride).
  std::vector<SampledRow> Sample(Backend& backend, const std::vector<float>& logits, int64_t vocab,
                                 const std::vector<RowSampling>& rows) {
    const int64_t stride = vocab + 3;
    const auto n = static_cast<int64_t>(rows.size());
    std::vector<float> padded(static_cast<size_t>(n * stride), 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&padded[r * stride], &logits[r * vocab], vocab * sizeof(float));
    }
    DeviceBuffer l = backend.Allocate(padded.size() * sizeof(float)).value();
    DeviceBuffer s = backend.Allocate(rows.size() * sizeof(RowSampling)).value();
    DeviceBuffer o = backend.Allocate(rows.size() * sizeof(SampledRow)).value();
    backend.CopyToDevice(l.data(), padded.data(), padded.size() * sizeof(float));
    backend.CopyToDevice(s.data(), rows.data(), rows.size() * sizeof(RowSampling));
    backend.SampleRows(Mat(l.as<float>(), n, vocab, stride),
                       DeviceSpan<const RowSampling>(s.as<RowSampling>(), rows.size()),
                       DeviceSpan<SampledRow>(o.as<SampledRow>(), rows.size()));
    std::vector<SampledRow> out(rows.size());
    backend.CopyToHost(out.data(), o.data(), out.size() * sizeof(SampledRow));
    return out;
  }

  void ExpectSame(const SampledRow& cpu, const SampledRow& gpu, const RowSampling& row,
                  const std::string& what) {
    const std::string where =
        absl::StrCat(what, " (t ", row.temperature, ", top_k ", row.top_k, ", top_p ", row.top_p,
                     ", min_p ", row.min_p, ", u ", row.uniform, ")");
    ASSERT_EQ(gpu.status, cpu.status) << where;
    EXPECT_EQ(gpu.token, cpu.token) << where;
    EXPECT_NEAR(gpu.logprob, cpu.logprob, 2e-4) << where;
    ASSERT_EQ(gpu.alternatives, cpu.alternatives) << where;
    for (int i = 0; i < cpu.alternatives; ++i) {
      EXPECT_EQ(gpu.alternative_tokens[i], cpu.alternative_tokens[i]) << where << " #" << i;
      EXPECT_NEAR(gpu.alternative_logprobs[i], cpu.alternative_logprobs[i], 2e-4) << where;
    }
  }

  CpuBackend cpu_{2};
  std::unique_ptr<Backend> gpu_;
};

// One vocabulary size per instance, so a sanitizer run can take the small ones.
class CudaSamplingVocabTest : public CudaSamplingTest,
                              public ::testing::WithParamInterface<int64_t> {};

TEST_P(CudaSamplingVocabTest, EveryMethodMatchesTheCpuForTheSameUniforms) {
  const int64_t vocab = GetParam();
  const std::vector<RowSampling> rows = Settings();
  const auto n = static_cast<int64_t>(rows.size());
  for (Shape shape :
       {Shape::kNormal, Shape::kPeaked, Shape::kTied, Shape::kConstant, Shape::kOffset}) {
    std::vector<float> logits;
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> row = Logits(shape, vocab, 100 * vocab + r);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const std::vector<SampledRow> cpu = Sample(cpu_, logits, vocab, rows);
    const std::vector<SampledRow> gpu = Sample(*gpu_, logits, vocab, rows);
    for (int64_t r = 0; r < n; ++r) {
      ExpectSame(cpu[r], gpu[r], rows[r],
                 absl::StrCat("shape ", static_cast<int>(shape), " row ", r));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, CudaSamplingVocabTest,
                         ::testing::Values(1, 37, 4099, 128256, 151936),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrCat("Vocab", info.param);
                         });

TEST_F(CudaSamplingTest, ARowSamplesTheSameAloneOrInABatchAndBadRowsStayAlone) {
  constexpr int64_t kVocab = 32000;
  const std::vector<RowSampling> rows = Settings();
  const auto n = static_cast<int64_t>(rows.size());
  std::vector<float> logits;
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> row = Logits(Shape::kNormal, kVocab, r);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  logits[5 * kVocab + 17] = NAN;
  logits[9 * kVocab + 3] = INFINITY;
  const std::vector<SampledRow> batch = Sample(*gpu_, logits, kVocab, rows);
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> one(logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab);
    const SampledRow alone = Sample(*gpu_, one, kVocab, {rows[r]})[0];
    EXPECT_EQ(std::memcmp(&alone, &batch[r], sizeof(SampledRow)), 0) << "row " << r;
    const bool bad = r == 5 || r == 9;
    EXPECT_EQ(batch[r].status, bad ? RowSampleStatus::kNonFinite : RowSampleStatus::kOk)
        << "row " << r;
  }
}

// Rows a grammar's mask has cut (-inf over most tokens, as MaskLogits writes): every method samples
// the same token and logprobs as the CPU, including top-k past the allowed count and 20
// alternatives with fewer allowed; a row with none allowed is non-finite on both.
TEST_F(CudaSamplingTest, MaskedRowsSampleAsOnTheCpu) {
  constexpr int64_t kVocab = 4099;
  const std::vector<RowSampling> rows = Settings();
  const auto n = static_cast<int64_t>(rows.size());
  std::mt19937_64 rng(77);
  std::vector<float> logits;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> row = Logits(Shape::kNormal, kVocab, 500 + r);
    const uint64_t keep_one_in = r % 3 == 0 ? 1000 : 10;  // a few allowed, or a tenth
    for (float& x : row) {
      if (rng() % keep_one_in != 0) x = -INFINITY;
    }
    if (r == n - 1) std::fill(row.begin(), row.end(), -INFINITY);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const std::vector<SampledRow> cpu = Sample(cpu_, logits, kVocab, rows);
  const std::vector<SampledRow> gpu = Sample(*gpu_, logits, kVocab, rows);
  for (int64_t r = 0; r < n; ++r) {
    ExpectSame(cpu[r], gpu[r], rows[r], absl::StrCat("masked row ", r));
  }
  EXPECT_EQ(cpu[n - 1].status, RowSampleStatus::kNonFinite);
}

// The device's MaskLogits writes what the CPU backend's does, bit for bit (NaN and +inf kept),
// at vocabularies with a partial last mask word and at Qwen3's.
TEST_F(CudaSamplingTest, MaskLogitsEqualsTheCpuBackend) {
  CpuBackend cpu(1);
  for (const int64_t vocab : {70, 4099, 151669}) {
    const testing::MaskLogitsCase want = testing::RunMaskLogits(cpu, vocab, 11);
    const testing::MaskLogitsCase got = testing::RunMaskLogits(*gpu_, vocab, 11);
    ASSERT_EQ(want.after.size(), got.after.size());
    EXPECT_EQ(std::memcmp(want.after.data(), got.after.data(), want.after.size() * sizeof(float)),
              0)
        << "vocab " << vocab;
  }
}

}  // namespace
}  // namespace specula
