// Per-thread scratch vectors of the CPU backend's kernels, sized so a steady decode step does
// not grow them: room for at least kScratchFloorBytes up front, then doubling. Contexts grow a
// token per step, so without the floor a vector sized by pages or keys would grow each time it
// passes a power of two.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace specula {

inline constexpr size_t kScratchFloorBytes = size_t{64} << 10;

template <typename T>
void ReserveScratch(std::vector<T>& v, size_t n) {
  if (v.capacity() >= n) return;
  v.reserve(std::max({n, 2 * v.capacity(), kScratchFloorBytes / sizeof(T)}));
}

}  // namespace specula
