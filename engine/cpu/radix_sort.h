// A stable LSD radix sort of 64-bit keys by a range of their bits, for the CPU backend's sparse
// bookkeeping: orderings of a few hundred keys a layer per step, where std::sort's comparisons
// and mispredicted branches cost more than two or three counting passes.
#pragma once

#include <cstdint>
#include <vector>

namespace specula {

// Sorts `keys` ascending by bits [lo_bit, hi_bit) alone (0 <= lo_bit < hi_bit <= 64); keys equal
// in those bits keep their order. Eight bits a pass; a pass whose digit every key shares is
// skipped, so keys that differ only in low bits cost one or two passes. `scratch` (a different
// vector) is resized to keys.size(), and the two may come back with their buffers exchanged:
// reserve both to keep a steady step from allocating. At most 2^32 - 1 keys.
void RadixSortByBits(std::vector<uint64_t>& keys, int lo_bit, int hi_bit,
                     std::vector<uint64_t>& scratch);

}  // namespace specula
