// The one seam between the forward pass and the KV cache (docs/ARCHITECTURE.md, "Engine"): per
// layer, "append these rows' K/V and attend with their queries". The transformer does not know
// whether the cache behind it is the dense paged pool, the sparse cache with host backing, or a
// layer-major prefill's buffer; each implements this interface for the rows it was planned for.
#pragma once

#include <cstdint>

#include "engine/backend/backend_types.h"

namespace specula {

// Rows [first, first + count) of a step's batch.
struct RowRange {
  int64_t first = 0;
  int64_t count = 0;
  bool empty() const { return count == 0; }
};

class KvAttention {
 public:
  virtual ~KvAttention() = default;

  // q [rows, heads * head_dim], k and v [rows, kv_heads * head_dim] are the batch's projections
  // after RoPE; out is like q. Appends the K/V of the rows this object owns and writes their
  // attention output into out; other rows are not touched.
  virtual void Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) = 0;

  // Cross-layer speculation: the rows whose queries for a layer the model should compute early,
  // from the previous layer's input, and hand to PredictLayer before that layer runs. Empty when
  // no row wants it.
  virtual RowRange EarlyQueryRows() const { return {}; }
  // q: the early queries of EarlyQueryRows() (rows 0..count-1 of q), RoPE applied.
  virtual void PredictLayer(int32_t /*layer*/, const Mat& /*q*/) {}
};

}  // namespace specula
