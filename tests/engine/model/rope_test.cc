// RoPE frequencies against values computed by hand from Hugging Face's rules: llama3 for the
// real Llama 3.1 parameters (theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192),
// yarn for Qwen3's 128K setting (theta 1e6, head_dim 128, factor 4, original 32768).
#include "engine/model/rope.h"

#include "gtest/gtest.h"

namespace specula {
namespace {

ModelConfig Llama31() {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

TEST(RopeTest, Llama3ScalingKeepsHighDividesLowAndSmoothsTheMiddle) {
  const std::vector<float> inv = RopeInverseFrequencies(Llama31());
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);                      // wavelength 6.3: high, unchanged
  EXPECT_FLOAT_EQ(inv[20], 0.016560440080994446f);    // wavelength 379: high, unchanged
  EXPECT_FLOAT_EQ(inv[30], 0.0013718935677611381f);   // wavelength 2948: smoothed
  EXPECT_FLOAT_EQ(inv[40], 0.0002742481756762073f / 8);  // wavelength 22911: low, / factor
  EXPECT_FLOAT_EQ(inv[63], 2.455140791131609e-06f / 8);
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  ModelConfig c;
  c.head_dim = 4;
  c.rope_theta = 10000.0;
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 2.0;
  const std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_FLOAT_EQ(inv[0], 0.5f);
  EXPECT_FLOAT_EQ(inv[1], 0.01f / 2);
}

ModelConfig Qwen3Yarn() {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.rope_scaling.type = RopeScaling::Type::kYarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 32768;
  return c;
}

// transformers 5, src/transformers/modeling_rope_utils.py, _compute_yarn_parameters:
//   find_correction_dim(r) = dim * ln(orig / (r * 2 pi)) / (2 ln base)
//   low = max(floor(find_correction_dim(beta_fast = 32)), 0)   = floor(23.596) = 23
//   high = min(ceil(find_correction_dim(beta_slow = 1)), dim - 1) = ceil(39.651) = 40
//   ramp(i) = clamp((i - low) / (high - low), 0, 1); extrapolation_factor = 1 - ramp
//   inv_freq = inv / factor * (1 - extrapolation_factor) + inv * extrapolation_factor
// Values below: that formula evaluated in float64 (Python), inv = 1 / 1e6^(2i / 128).
TEST(RopeTest, YarnMatchesTransformersFormulas) {
  const ModelConfig c = Qwen3Yarn();
  const YarnRamp ramp = YarnCorrectionRange(c);
  EXPECT_EQ(ramp.low, 23.0);
  EXPECT_EQ(ramp.high, 40.0);
  const std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);                       // ramp 0: kept
  EXPECT_FLOAT_EQ(inv[23], 0.006978305848598663f);     // ramp 0: kept
  EXPECT_FLOAT_EQ(inv[24], 0.005375321490790102f);     // ramp 1/17
  EXPECT_FLOAT_EQ(inv[30], 0.0010643609812470017f);    // ramp 7/17
  EXPECT_FLOAT_EQ(inv[40], 4.445698525097307e-05f);    // ramp 1: divided by factor
  EXPECT_FLOAT_EQ(inv[63], 3.102344401879299e-07f);
  // truncate = false keeps the fractional range: (23.596, 39.651).
  ModelConfig untruncated = c;
  untruncated.rope_scaling.truncate = false;
  EXPECT_NEAR(YarnCorrectionRange(untruncated).low, 23.5959476083381, 1e-9);
  EXPECT_NEAR(YarnCorrectionRange(untruncated).high, 39.6508807104171, 1e-9);
  EXPECT_FLOAT_EQ(RopeInverseFrequencies(untruncated)[30], 0.0010792377416765538f);
}

}  // namespace
}  // namespace specula
