// Top-k selection over page scores on the CPU backend: the step between scoring and residency.
// Higher score first, NaN below every number, ties to the lower index, so results are
// deterministic (the CUDA kernel follows the same order).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace specula {

// Replaces *out with the indices of the `k` best scores, best first. k >= scores.size() ranks
// every index; k must be >= 0. O(n + k log k) on average. *out is resized, never shrunk in
// capacity, so a reused vector does not allocate in steady state.
void RankTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out);
// Reserves this thread's ranking scratch now (engine/cpu/scratch.h), so a later ranking on it
// does not allocate.
void ReserveTopPagesScratch();

// Replaces *out with the indices of the `k` best scores: the best `first` of them first in any
// order, then the rest best first (first <= k). Cheaper than ranking all k when only the set of
// the best `first` matters.
void PartitionTopPages(absl::Span<const float> scores, int32_t first, int32_t k,
                       std::vector<int32_t>* out);

// Replaces *out with the indices of the `k` best scores, sorted ascending by index so attention
// reads the chosen pages in position order.
void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out);

// Sorts `pages`, distinct indices within [begin, end), ascending. Sets that fill a sixteenth of
// the range or more are marked and read back in O(end - begin) (a 50% budget selects half the
// candidates: sorting them by comparison cost several times more); smaller ones are compared. A
// duplicate or an index out of range is a CHECK failure.
void SortPageSet(std::vector<int32_t>& pages, int32_t begin, int32_t end);

}  // namespace specula
