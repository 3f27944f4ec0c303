// Seeded pseudo-random values for the kernel benchmarks' inputs, where only shapes and addresses
// matter: n values in [-scale, scale] in steps of scale / 1000, from a 64-bit LCG.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specula {

inline std::vector<float> RandomValues(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = (static_cast<float>(static_cast<int32_t>(seed >> 33) % 2001) / 1000.0f - 1.0f) * scale;
  }
  return v;
}

}  // namespace specula
