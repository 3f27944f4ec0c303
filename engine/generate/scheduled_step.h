// What one engine step runs, as the Scheduler chose it and the ModelRunner runs it: the rows, the
// batched forward pass's tokens, and each row's attention metadata (filled by the sequence's KV
// manager). Kept across steps so a steady step allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/step_plan.h"
#include "engine/generate/sequence.h"
#include "engine/generate/sparse_prefill.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/sparse_decode.h"

namespace specula {

// A sequence's part in a step.
struct ScheduledRow {
  Sequence* seq = nullptr;
  int64_t n = 0;  // tokens through the batched forward pass (0 for a layer-major prefill)
  bool prefill = false;
  bool sample = false;  // has a logit row (in `rows` order)
};

struct ScheduledStep {
  std::vector<ScheduledRow> rows;
  std::vector<int32_t> tokens, positions, logit_rows;  // of the batched forward pass
  std::vector<DenseSeqRows> dense;                     // rows [0, dense rows)
  std::vector<SparseDecodeRow> sparse_decode;          // after them
  SparsePrefill* sparse_prefill = nullptr;             // this step's layer-major prefill
  Sequence* sparse_prefill_seq = nullptr;
  int64_t sparse_layer_tokens = 0;
  PlanSlice<int32_t> tokens_slice, positions_slice, logit_rows_slice;

  // Appends `seq`'s next `n` tokens (from its kv_len) and their positions to the batched forward
  // pass; returns the first one's row.
  int32_t AppendTokens(const Sequence& seq, int64_t n) {
    const auto q_begin = static_cast<int32_t>(tokens.size());
    const int64_t start = seq.kv_len();
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(seq.TokenAt(start + i));
      positions.push_back(static_cast<int32_t>(start + i));
    }
    return q_begin;
  }
  // Adds the row of `n` tokens from `q_begin`; it samples (a logit row) when it decodes or its
  // chunk ends the prefill.
  void AddRow(Sequence& seq, int64_t n, bool prefill, int32_t q_begin) {
    const bool sample = !prefill || n == seq.prefill_remaining();
    if (sample) logit_rows.push_back(q_begin + static_cast<int32_t>(n) - 1);
    rows.push_back({&seq, n, prefill, sample});
  }

  // Empties it for the next step, keeping the vectors' storage.
  void Clear() {
    rows.clear();
    tokens.clear();
    positions.clear();
    logit_rows.clear();
    dense.clear();
    sparse_decode.clear();
    sparse_prefill = nullptr;
    sparse_prefill_seq = nullptr;
    sparse_layer_tokens = 0;
    tokens_slice = positions_slice = logit_rows_slice = {};
  }
};

}  // namespace specula
