// RoPE frequencies against values computed by hand from Hugging Face's llama3 rule, for the
// real Llama 3.1 parameters (theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192).
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

}  // namespace
}  // namespace specula
