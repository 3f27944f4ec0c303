// Seeded standard-normal test data for the CPU backend's op tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace specula::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace specula::testing
