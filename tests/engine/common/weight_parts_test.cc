// Converting checkpoint tensors into a backend's weight format: dtype pairs, and ranges of a
// concatenation that cross tensor boundaries (the fill threads' slices).
#include "engine/common/weight_parts.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

constexpr DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Values exact in every dtype (small integers over powers of two) plus ones that round.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i % 3 == 0 ? static_cast<float>(i % 17) / 8 : u(rng);
  return v;
}

std::vector<std::byte> Encoded(const std::vector<float>& v, DType t) {
  std::vector<std::byte> out(v.size() * DTypeSize(t));
  ConvertFromF32(t, v.data(), out.data(), v.size());
  return out;
}

// The element-by-element meaning: through fp32, each step already tested on its own.
std::vector<std::byte> ThroughF32(const std::vector<std::byte>& src, DType from, DType to) {
  const size_t n = src.size() / DTypeSize(from);
  std::vector<float> f(n);
  ConvertToF32(from, src.data(), f.data(), n);
  return Encoded(f, to);
}

TEST(ConvertDType, EveryPairEqualsTheRoundTripThroughF32) {
  const std::vector<float> v = Values(1500, 1);  // past the half-to-half tile of 512
  for (DType from : kTypes) {
    const std::vector<std::byte> src = Encoded(v, from);
    for (DType to : kTypes) {
      std::vector<std::byte> got(v.size() * DTypeSize(to), std::byte{0x5a});
      ConvertDType(from, src.data(), to, got.data(), v.size());
      EXPECT_EQ(got, ThroughF32(src, from, to)) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST(ConvertDType, HalfToHalfRoundsToNearestEven) {
  // Both are exact in f16. bf16 keeps 7 mantissa bits: 1 + 2^-10 rounds down to 1, and
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 and goes to the even one.
  const std::vector<float> v = {1.0f + 0x1p-10f, 1.0f + 3 * 0x1p-8f};
  const std::vector<std::byte> f16 = Encoded(v, DType::kF16);
  uint16_t bf16[2];
  ConvertDType(DType::kF16, f16.data(), DType::kBF16, bf16, 2);
  EXPECT_EQ(bf16[0], 0x3f80);  // 1.0
  EXPECT_EQ(bf16[1], 0x3f82);  // 1 + 2^-6 (even mantissa), not 1 + 2^-7
}

struct Concatenation {
  std::vector<std::vector<std::byte>> storage;
  std::vector<WeightPart> parts;
  std::vector<float> values;  // the whole concatenation in fp32
};

// Three tensors of different dtypes and sizes, as Q, K and V of a checkpoint might be.
Concatenation Mixed() {
  Concatenation c;
  const DType types[] = {DType::kBF16, DType::kF32, DType::kF16};
  const size_t sizes[] = {700, 301, 999};
  for (int i = 0; i < 3; ++i) {
    std::vector<float> v = Values(sizes[i], 10 + i);
    c.storage.push_back(Encoded(v, types[i]));
    std::vector<float> exact(v.size());  // what the stored tensor holds
    ConvertToF32(types[i], c.storage.back().data(), exact.data(), v.size());
    c.values.insert(c.values.end(), exact.begin(), exact.end());
  }
  for (int i = 0; i < 3; ++i) {
    c.parts.push_back({types[i], c.storage[i].data(), static_cast<int64_t>(sizes[i])});
  }
  return c;
}

TEST(ConvertWeightRange, AnySlicingGivesTheWholeConcatenation) {
  const Concatenation c = Mixed();
  const int64_t n = TotalElements(c.parts);
  ASSERT_EQ(n, static_cast<int64_t>(c.values.size()));
  for (DType to : kTypes) {
    const std::vector<std::byte> want = Encoded(c.values, to);
    // Slices that start and end inside parts, on their boundaries, and span all three.
    for (int64_t step : {int64_t{1}, int64_t{7}, int64_t{300}, int64_t{701}, n}) {
      std::vector<std::byte> got(want.size(), std::byte{0x5a});
      for (int64_t b = 0; b < n; b += step) {
        const int64_t e = std::min(n, b + step);
        ConvertWeightRange(c.parts, b, e, to, got.data() + b * DTypeSize(to));
      }
      EXPECT_EQ(got, want) << DTypeName(to) << " in slices of " << step;
    }
  }
}

TEST(ConvertWeightRange, WritesOnlyItsRange) {
  const Concatenation c = Mixed();
  std::vector<float> got(10, -7.0f);
  ConvertWeightRange(c.parts, 695, 705, DType::kF32, got.data() + 0);  // across bf16 | f32
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], c.values[695 + i]) << i;
  std::vector<float> guard(4, -7.0f);
  ConvertWeightRange(c.parts, 1000, 1002, DType::kF32, guard.data() + 1);  // f32 | f16 border
  EXPECT_EQ(guard[0], -7.0f);
  EXPECT_EQ(guard[1], c.values[1000]);
  EXPECT_EQ(guard[2], c.values[1001]);
  EXPECT_EQ(guard[3], -7.0f);
}

}  // namespace
}  // namespace specula
