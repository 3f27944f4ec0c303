#include "engine/kv/top_pages.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/check.h"

namespace specula {

void SelectTopPages(absl::Span<const float> scores, int32_t k, std::vector<int32_t>* out) {
  CHECK_GE(k, 0);
  const size_t n = scores.size();
  out->resize(n);
  std::iota(out->begin(), out->end(), 0);
  if (static_cast<size_t>(k) >= n) return;
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
  std::nth_element(out->begin(), out->begin() + k, out->end(), better);
  out->resize(k);
  std::sort(out->begin(), out->end());
}

}  // namespace specula
