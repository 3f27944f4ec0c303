// One Backend::MaskLogits case for any backend: three rows of `vocab` logits stored with a padded
// row stride, masks (random bits) for rows 2 and 0, row 1 unmasked, and a NaN and a +inf at
// refused tokens of row 0. The CPU backend's test checks it element by element; the CUDA test
// compares the two backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "tests/engine/cpu/device_data.h"

namespace specula::testing {

struct MaskLogitsCase {
  int64_t vocab = 0, stride = 0;
  std::vector<int32_t> rows;         // the logits row of each mask
  std::vector<uint32_t> bits;        // [rows.size(), words]
  std::vector<float> before, after;  // [3, stride]
  int64_t nan_at = 0, inf_at = 0;    // refused tokens of row 0
};

inline MaskLogitsCase RunMaskLogits(Backend& backend, int64_t vocab, uint32_t seed) {
  MaskLogitsCase c;
  c.vocab = vocab;
  c.stride = vocab + 5;
  c.rows = {2, 0};
  const int64_t words = (vocab + 31) / 32;
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < 2 * words; ++i) c.bits.push_back(static_cast<uint32_t>(rng()));
  c.bits[words] &= ~uint32_t{3};  // row 0's tokens 0 and 1 are refused
  c.nan_at = 0;
  c.inf_at = 1;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < 3 * c.stride; ++i) c.before.push_back(normal(rng));
  c.before[c.nan_at] = NAN;
  c.before[c.inf_at] = INFINITY;
  DeviceData data(backend);
  DeviceSpan<float> logits = data.Zeros<float>(c.before.size());
  backend.CopyToDevice(logits.data(), c.before.data(), logits.bytes());
  backend.MaskLogits(Mat(logits.data(), 3, vocab, c.stride), data.Put(c.rows), data.Put(c.bits));
  c.after = data.Get(logits);
  return c;
}

}  // namespace specula::testing
