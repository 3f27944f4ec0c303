#include "engine/cpu/radix_sort.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

uint64_t Bits(uint64_t key, int lo, int hi) {
  const uint64_t field = key >> lo;
  return hi - lo == 64 ? field : field & ((uint64_t{1} << (hi - lo)) - 1);
}

// The specification: a stable sort by the bit field alone.
std::vector<uint64_t> Reference(std::vector<uint64_t> keys, int lo, int hi) {
  std::stable_sort(keys.begin(), keys.end(),
                   [&](uint64_t a, uint64_t b) { return Bits(a, lo, hi) < Bits(b, lo, hi); });
  return keys;
}

TEST(RadixSortTest, StableByTheBitFieldAloneForEveryRange) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> scratch;
  const int ranges[][2] = {{0, 64}, {24, 63}, {24, 56}, {3, 17}, {60, 64}, {0, 1}, {32, 64}};
  for (int trial = 0; trial < 400; ++trial) {
    const auto [lo, hi] = ranges[trial % 7];
    const size_t n = rng() % 300;
    std::vector<uint64_t> keys(n);
    for (uint64_t& k : keys) {
      // Few distinct field values in some trials (ties keep their order), and fields whose
      // high digits all agree in others (their passes are skipped).
      k = rng();
      if (trial % 3 == 0) k = (k & ~(uint64_t{0xF} << lo)) | ((rng() % 3) << lo);
      if (trial % 3 == 1 && lo + 8 < 64) k &= ~(~uint64_t{0} << (lo + 8));
    }
    const std::vector<uint64_t> expected = Reference(keys, lo, hi);
    RadixSortByBits(keys, lo, hi, scratch);
    ASSERT_EQ(keys, expected) << "trial " << trial << " bits [" << lo << ", " << hi << ")";
  }
}

// The bytes of a field ordered against their low digit: a sort that looked at one pass only,
// or skipped a pass whose digit varies, gets these wrong.
TEST(RadixSortTest, AHighDigitOutranksTheLowOnes) {
  std::vector<uint64_t> keys = {0x101, 0x0FF, 0x200, 0x1FF, 0x001};
  std::vector<uint64_t> scratch;
  RadixSortByBits(keys, 0, 16, scratch);
  EXPECT_EQ(keys, (std::vector<uint64_t>{0x001, 0x0FF, 0x101, 0x1FF, 0x200}));
}

TEST(RadixSortDeathTest, ABitRangeOutsideTheKeyOrAnAliasedScratchIsRefused) {
  std::vector<uint64_t> keys = {2, 1};
  std::vector<uint64_t> scratch;
  EXPECT_DEATH(RadixSortByBits(keys, 8, 65, scratch), "bits");
  EXPECT_DEATH(RadixSortByBits(keys, 8, 8, scratch), "bits");
  EXPECT_DEATH(RadixSortByBits(keys, 0, 8, keys), "another vector");
}

}  // namespace
}  // namespace specula
