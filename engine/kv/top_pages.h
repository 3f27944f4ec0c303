// Top-k selection over page scores: the step between scoring (PageSelector) and fetching.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace specula {

// Replaces *out with the indices of the `k` highest scores, sorted ascending by index so attention
// reads the chosen pages in position order. Ties go to the lower index; NaN ranks below every
// number. k >= scores.size() returns every index; k must be >= 0. O(n + k log k) on average.
void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out);

}  // namespace specula
