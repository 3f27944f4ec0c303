#include "engine/cpu/radix_sort.h"

#include <array>
#include <utility>

#include "engine/common/check.h"

namespace specula {

void RadixSortByBits(std::vector<uint64_t>& keys, int lo_bit, int hi_bit,
                     std::vector<uint64_t>& scratch) {
  CHECK(0 <= lo_bit && lo_bit < hi_bit && hi_bit <= 64)
      << "bits [" << lo_bit << ", " << hi_bit << ")";
  CHECK(&keys != &scratch) << "the scratch must be another vector";
  const size_t n = keys.size();
  CHECK_LT(n, size_t{1} << 32) << "bucket counts are 32-bit";
  if (n < 2) return;
  scratch.resize(n);
  for (int shift = lo_bit; shift < hi_bit; shift += 8) {
    const int width = std::min(8, hi_bit - shift);
    const uint64_t mask = (uint64_t{1} << width) - 1;
    std::array<uint32_t, 256> count{};
    for (uint64_t k : keys) ++count[(k >> shift) & mask];
    if (count[(keys[0] >> shift) & mask] == n) continue;  // one digit: already in order here
    uint32_t at = 0;
    for (uint32_t& c : count) at += std::exchange(c, at);  // bucket starts
    for (uint64_t k : keys) scratch[count[(k >> shift) & mask]++] = k;
    keys.swap(scratch);
  }
}

}  // namespace specula
