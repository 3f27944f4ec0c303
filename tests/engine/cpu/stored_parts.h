// A weight as a checkpoint holds it, for the uploader tests of every backend: tensors of the
// given dtypes (seeded normal values, stored in each dtype) and the concatenation's exact fp32
// values, which every upload must reproduce.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/weight_parts.h"
#include "tests/engine/cpu/random_vector.h"

namespace specula::testing {

struct StoredParts {
  std::vector<std::vector<uint8_t>> storage;  // what the file holds, one buffer per tensor
  std::vector<WeightPart> parts;              // views of `storage`
  std::vector<float> values;                  // the concatenation, exact in fp32
};

// One tensor of `numel` elements per dtype, tensor i drawn with seed `seed + i`.
inline StoredParts MakeStoredParts(const std::vector<DType>& types, int64_t numel,
                                   uint32_t seed) {
  StoredParts s;
  s.storage.reserve(types.size());  // `parts` point into these buffers
  for (size_t i = 0; i < types.size(); ++i) {
    const std::vector<float> v = RandomVector(static_cast<size_t>(numel), seed + i);
    s.storage.emplace_back(v.size() * DTypeSize(types[i]));
    ConvertFromF32(types[i], v.data(), s.storage.back().data(), v.size());
    std::vector<float> exact(v.size());
    ConvertToF32(types[i], s.storage.back().data(), exact.data(), v.size());
    s.values.insert(s.values.end(), exact.begin(), exact.end());
    s.parts.push_back({types[i], s.storage.back().data(), numel});
  }
  return s;
}

}  // namespace specula::testing
