// Integer ceiling division: the one definition of "how many pages (blocks, splits) cover n".
// constexpr, so CUDA device code calls it too (kernels build with --expt-relaxed-constexpr).
#pragma once

#include <cstdint>

namespace specula {

// ceil(n / d) for n >= 0, d > 0.
constexpr int64_t CeilDiv(int64_t n, int64_t d) { return (n + d - 1) / d; }

}  // namespace specula
