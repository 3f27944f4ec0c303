// The CPU backend is the reference for every other backend, so each op is checked here against a
// direct, obviously-correct computation.
#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/kv/kv_pool.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu/device_data.h"
#include "tests/engine/cpu/mask_logits_case.h"
#include "tests/engine/cpu/random_vector.h"
#include "tests/engine/cpu/stored_parts.h"

namespace specula {
namespace {

using ::specula::testing::DenseBatch;
using ::specula::testing::DeviceData;
using ::specula::testing::MakeStoredParts;
using ::specula::testing::RandomVector;
using ::specula::testing::StoredParts;

class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackend backend_{2};
  DeviceData data_{backend_};
};

class CpuGemmTest : public CpuBackendTest, public ::testing::WithParamInterface<int> {};

// One row takes the GEMV path, more rows the GEMM path.
TEST_P(CpuGemmTest, WithBiasMatchesNaive) {
  const int m = GetParam(), n = 7, k = 9;
  auto x = RandomVector(m * k, 1), wv = RandomVector(n * k, 2), bv = RandomVector(n, 3);
  auto w = backend_.UploadWeight(wv.data(), n, k).value();
  auto b = backend_.UploadWeight(bv.data(), 1, n).value();
  std::vector<float> y(m * n);
  Mat ym(y.data(), m, n);
  backend_.Gemm(Mat(x.data(), m, k), w, b, &ym);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = bv[j];
      for (int c = 0; c < k; ++c) ref += static_cast<double>(x[i * k + c]) * wv[j * k + c];
      EXPECT_NEAR(y[i * n + j], ref, 1e-4) << i << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, CpuGemmTest, ::testing::Values(1, 2, 5));

TEST_F(CpuBackendTest, GemmHonoursRowStride) {
  const int m = 3, k = 4, n = 2, stride = 10;
  auto x = RandomVector(m * stride, 4), wv = RandomVector(n * k, 5);
  auto w = backend_.UploadWeight(wv.data(), n, k).value();
  std::vector<float> y(m * stride, 42.0f);
  Mat ym(y.data() + 1, m, n, stride);
  backend_.Gemm(Mat(x.data() + 2, m, k, stride), w, Weight{}, &ym);
  for (int i = 0; i < m; ++i) {
    EXPECT_EQ(y[i * stride], 42.0f);  // neighbours untouched
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int c = 0; c < k; ++c) ref += x[i * stride + 2 + c] * wv[j * k + c];
      EXPECT_NEAR(y[i * stride + 1 + j], ref, 1e-5);
    }
  }
}

TEST_F(CpuBackendTest, RmsNormInPlace) {
  const int rows = 3, cols = 8;
  auto x = RandomVector(rows * cols, 6), wv = RandomVector(cols, 7);
  auto original = x;
  auto w = backend_.UploadWeight(wv.data(), 1, cols).value();
  Mat m(x.data(), rows, cols);
  backend_.RmsNorm(m, w, 1e-5f, &m);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += original[r * cols + c] * original[r * cols + c];
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
    for (int c = 0; c < cols; ++c) {
      EXPECT_NEAR(x[r * cols + c], original[r * cols + c] * inv * wv[c], 1e-5);
    }
  }
}

TEST_F(CpuBackendTest, RopeRotatesHalvesAtPosition) {
  // head_dim 4: pairs (0, 2) and (1, 3) rotate by pos * inv_freq[0] and pos * inv_freq[1].
  std::vector<float> x = {1, 2, 3, 4, /*second head*/ 5, 6, 7, 8};
  Mat m(x.data(), 1, 8);
  const std::vector<float> inv_freq = {0.5f, 0.25f};
  backend_.Rope(&m, 2, 4, data_.Put(std::vector<int32_t>{3}), data_.Put(inv_freq));
  const double a0 = 1.5, a1 = 0.75;
  EXPECT_NEAR(x[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[4], 5 * std::cos(a0) - 7 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[7], 8 * std::cos(a1) + 6 * std::sin(a1), 1e-6);
}

TEST_F(CpuBackendTest, SwiGluAndAddAndGather) {
  std::vector<float> gu = {1.0f, -2.0f, 3.0f, 4.0f};  // gate {1,-2}, up {3,4}
  std::vector<float> out(2);
  Mat o(out.data(), 1, 2);
  backend_.SwiGlu(Mat(gu.data(), 1, 4), &o);
  EXPECT_NEAR(out[0], 1.0 / (1 + std::exp(-1.0)) * 3, 1e-6);
  EXPECT_NEAR(out[1], -2.0 / (1 + std::exp(2.0)) * 4, 1e-6);

  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  Mat am(a.data(), 2, 2);
  backend_.Add(&am, Mat(b.data(), 2, 2));
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33, 44}));

  std::vector<float> g(4);
  Mat gm(g.data(), 2, 2);
  backend_.GatherRows(am, data_.Put(std::vector<int32_t>{1, 0}), &gm);
  EXPECT_EQ(g, (std::vector<float>{33, 44, 11, 22}));
}

// Each row of a strided logits matrix is sampled with its own settings (the method's own tests
// are tests/engine/sampling/row_sampling_test.cc).
TEST_F(CpuBackendTest, SampleRowsSamplesEachRowWithItsSettings) {
  // Row r's most likely token is r + 1; the padding column would win if the stride were ignored.
  std::vector<float> logits = {0, 5, 1, 1, 9,  //
                               0, 1, 5, 1, 9,  //
                               0, 1, 1, 5, 9};
  std::vector<RowSampling> rows(3);
  rows[1].logprobs = 2;
  rows[2].temperature = 1.0f;
  rows[2].top_k = 1;
  rows[2].uniform = 0.9;
  DeviceBuffer out_buffer = backend_.Allocate(3 * sizeof(SampledRow)).value();
  const DeviceSpan<SampledRow> out(out_buffer.as<SampledRow>(), 3);
  backend_.SampleRows(Mat(logits.data(), 3, 4, 5), data_.Put(rows), out);
  EXPECT_EQ(out.data()[0].token, 1);
  EXPECT_EQ(out.data()[1].token, 2);
  EXPECT_EQ(out.data()[1].alternatives, 2);
  EXPECT_EQ(out.data()[1].alternative_tokens[1], 1);  // of the tied 1s, the lower id
  EXPECT_EQ(out.data()[2].token, 3);
  EXPECT_EQ(out.data()[0].alternatives, 0);
}

// The value a KV page of `dtype` holds for x: x rounded to nearest even.
float StoredAs(DType dtype, float x) {
  uint32_t stored = 0;
  ConvertFromF32(dtype, &x, &stored, 1);
  float back = 0;
  ConvertToF32(dtype, &stored, &back, 1);
  return back;
}

class PagedAttentionTest : public CpuBackendTest, public ::testing::WithParamInterface<DType> {};

// Paged attention with GQA, several sequences, a prefill chunk and a decode row, against dense
// causal softmax attention computed directly from the K/V rows, for every KV dtype: bf16 and
// f16 pages hold the rows rounded (WriteKv rounds) and attention reads them back in fp32, so the
// reference over the rounded rows matches as closely as the fp32 case does.
TEST_P(PagedAttentionTest, MatchesDenseCausal) {
  const DType dtype = GetParam();
  const int heads = 4, kv_heads = 2, hd = 8, page = 4;
  KvPoolOptions opt{1, kv_heads, hd, page, 16};
  opt.dtype = dtype;
  KvPool pool = KvPool::Create(backend_, opt).value();
  EXPECT_EQ(pool.bytes_per_block(), 2u * kv_heads * page * hd * DTypeSize(dtype));
  const KvLayerView layer = pool.Layer(0);

  struct SeqSpec {
    int kv_len, q_len;
  };
  const std::vector<SeqSpec> specs = {{11, 5}, {6, 1}, {3, 3}};
  DenseBatch dense;
  std::vector<int> q_begin;
  std::vector<std::vector<float>> ks, vs;  // per sequence [kv_len, kv_heads*hd]
  uint32_t seed = 100;
  for (const SeqSpec& s : specs) {
    auto seq_blocks = pool.Allocate(pool.BlocksFor(s.kv_len)).value();
    auto k = RandomVector(s.kv_len * kv_heads * hd, seed++);
    auto v = RandomVector(s.kv_len * kv_heads * hd, seed++);
    std::vector<int32_t> wb, wo;
    for (int t = 0; t < s.kv_len; ++t) {
      wb.push_back(seq_blocks[t / page]);
      wo.push_back(t % page);
    }
    backend_.WriteKv(Mat(k.data(), s.kv_len, kv_heads * hd), Mat(v.data(), s.kv_len, kv_heads * hd),
                     KvWrite{data_.Put(wb), data_.Put(wo)}, layer);
    q_begin.push_back(dense.rows);
    dense.Add(s.q_len, s.kv_len, seq_blocks);
    for (float& x : k) x = StoredAs(dtype, x);
    for (float& x : v) x = StoredAs(dtype, x);
    ks.push_back(k);
    vs.push_back(v);
  }
  const int q_rows = dense.rows;
  auto q = RandomVector(q_rows * heads * hd, 7);
  std::vector<float> out(q_rows * heads * hd);
  Mat om(out.data(), q_rows, heads * hd);
  backend_.PagedAttention(Mat(q.data(), q_rows, heads * hd), dense.Batch(data_, heads, 0.3f), layer,
                          &om);

  for (size_t s = 0; s < specs.size(); ++s) {
    for (int i = 0; i < specs[s].q_len; ++i) {
      const int row = q_begin[s] + i;
      const int n_keys = specs[s].kv_len - specs[s].q_len + i + 1;
      for (int h = 0; h < heads; ++h) {
        const int g = h / (heads / kv_heads);
        std::vector<double> p(n_keys);
        double mx = -1e30, sum = 0;
        for (int j = 0; j < n_keys; ++j) {
          double dot = 0;
          for (int c = 0; c < hd; ++c) {
            dot += q[(row * heads + h) * hd + c] * ks[s][(j * kv_heads + g) * hd + c];
          }
          p[j] = dot * 0.3;
          mx = std::max(mx, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int c = 0; c < hd; ++c) {
          double ref = 0;
          for (int j = 0; j < n_keys; ++j) ref += p[j] / sum * vs[s][(j * kv_heads + g) * hd + c];
          EXPECT_NEAR(out[(row * heads + h) * hd + c], ref, 1e-5)
              << "seq " << s << " row " << i << " head " << h;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, PagedAttentionTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(KvPoolTest, AllocateFreeAndExhaustion) {
  CpuBackend backend(1);
  KvPool pool = KvPool::Create(backend, KvPoolOptions{2, 2, 4, 16, 4}).value();
  EXPECT_EQ(pool.BlocksFor(1), 1);
  EXPECT_EQ(pool.BlocksFor(16), 1);
  EXPECT_EQ(pool.BlocksFor(17), 2);
  auto a = pool.Allocate(3).value();
  EXPECT_EQ(pool.used_blocks(), 3);
  auto full = pool.Allocate(2);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.used_blocks(), 3);  // a failed allocation takes nothing
  pool.Free(a);
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(KvPool::Create(backend, KvPoolOptions{0, 2, 4, 16, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A weight concatenated from tensors of three dtypes, large enough that the pool's threads each
// convert a slice: every element lands at its place, exactly converted to fp32.
TEST_F(CpuBackendTest, WeightUploaderConvertsEachPartIntoPlace) {
  constexpr int64_t kIn = 1000, kRowsPerPart = 200;  // 600K elements: several pool slices
  const StoredParts stored =
      MakeStoredParts({DType::kBF16, DType::kF32, DType::kF16}, kRowsPerPart * kIn, 40);
  auto uploader = backend_.CreateWeightUploader(kWeightStagingBytes);
  Weight w = uploader->Upload(stored.parts, 3 * kRowsPerPart, kIn).value();
  EXPECT_EQ(w.dtype, DType::kF32);
  EXPECT_EQ(w.out, 3 * kRowsPerPart);
  EXPECT_EQ(w.in, kIn);
  const float* got = w.buffer.as<float>();
  EXPECT_TRUE(std::equal(stored.values.begin(), stored.values.end(), got));
}

// A grammar's mask on the rows it belongs to: a refused token's logit becomes -inf, an allowed
// one keeps its value, NaN and +inf stay (SampleRows reports them), and an unmasked row and the
// padding past the vocabulary are untouched. 70 tokens: the last mask word is partial.
TEST_F(CpuBackendTest, MaskLogitsRefusesWhatEachMaskClears) {
  const testing::MaskLogitsCase c = testing::RunMaskLogits(backend_, 70, 5);
  const int64_t words = (c.vocab + 31) / 32;
  for (int64_t row = 0; row < 3; ++row) {
    const int mask = row == 2 ? 0 : row == 0 ? 1 : -1;
    for (int64_t t = 0; t < c.stride; ++t) {
      const float before = c.before[row * c.stride + t];
      const float after = c.after[row * c.stride + t];
      const bool refused =
          mask >= 0 && t < c.vocab && !((c.bits[mask * words + t / 32] >> (t % 32)) & 1);
      if (refused && std::isfinite(before)) {
        EXPECT_EQ(after, -INFINITY) << row << " " << t;
      } else if (std::isnan(before)) {
        EXPECT_TRUE(std::isnan(after)) << row << " " << t;
      } else {
        EXPECT_EQ(after, before) << row << " " << t;
      }
    }
  }
  EXPECT_TRUE(std::isnan(c.after[c.nan_at]));
  EXPECT_EQ(c.after[c.inf_at], INFINITY);
}

}  // namespace
}  // namespace specula
