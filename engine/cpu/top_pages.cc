#include "engine/cpu/top_pages.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/check.h"

namespace specula {

void RankTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  CHECK_GE(k, 0);
  const size_t n = scores.size();
  out->resize(n);
  std::iota(out->begin(), out->end(), 0);
  // A strict weak order even with NaN (which would break a plain `>`): higher score first, NaN
  // last, then lower index, so the result is deterministic.
  auto better = [&scores](int32_t a, int32_t b) {
    const float sa = scores[a];
    const float sb = scores[b];
    const bool na = std::isnan(sa);
    const bool nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  const size_t take = std::min<size_t>(static_cast<size_t>(k), n);
  if (take < n) std::nth_element(out->begin(), out->begin() + take, out->end(), better);
  out->resize(take);
  std::sort(out->begin(), out->end(), better);
}

void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  RankTopPages(scores, k, out);
  std::sort(out->begin(), out->end());
}

}  // namespace specula
