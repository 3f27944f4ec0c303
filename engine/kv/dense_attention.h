// Dense rows behind the model's KV seam: their K/V go into the device KV pool's blocks and they
// attend causally over their sequences' block tables (paged attention).
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/kv/kv_pool.h"
#include "engine/model/kv_attention.h"

namespace specula {

// One dense sequence's rows in a step: q rows [q_begin, q_begin + q_len) at key positions
// kv_len - q_len ... kv_len - 1, over `blocks` (its block table, covering kv_len keys).
struct DenseSeqRows {
  int32_t q_begin = 0;
  int32_t q_len = 0;
  int32_t kv_len = 0;
  absl::Span<const int32_t> blocks;
};

class DenseKvAttention : public KvAttention {
 public:
  // `softmax_scale`: ModelConfig::softmax_scale().
  DenseKvAttention(Backend& backend, KvPool& pool, int32_t num_heads, float softmax_scale)
      : backend_(backend), pool_(pool), num_heads_(num_heads), softmax_scale_(softmax_scale) {}

  // Plans the step's dense sequences; they must tile rows [0, n) in order. With
  // `decode_keys_capacity` (every row a decode row, none with more keys): the rows are attended
  // as if the longest had that many keys (the attention's launch shape depends on it alone) and
  // the block table takes room for that many keys a row, so every step of the same rows and
  // capacity plans the same layout and launches (what a recorded step needs).
  void Plan(absl::Span<const DenseSeqRows> seqs, StepPlan& plan, int32_t decode_keys_capacity = 0);
  void Bind(const StepPlan& plan);
  int32_t rows() const { return rows_; }

  void Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) override;

 private:
  Backend& backend_;
  KvPool& pool_;
  int32_t num_heads_;
  float softmax_scale_;
  // Rows attended in one backend call: the leading decode rows (attended row by row: seqs 0),
  // or the rest (the prefill chunks, with their sequences).
  struct Part {
    int32_t first_row = 0;
    int32_t rows = 0;
    int32_t max_keys = 0;
    int32_t seqs = 0;
    int32_t max_seq_rows = 0;
  };
  void AttendPart(const Part& part, const Mat& q, const KvLayerView& view, Mat* out);

  int32_t rows_ = 0;
  Part decode_, chunks_;
  PlanSlice<int32_t> write_blocks_, write_offsets_, row_keys_, row_begin_, blocks_, seq_rows_;
  DeviceSpan<const int32_t> d_write_blocks_, d_write_offsets_, d_row_keys_, d_row_begin_, d_blocks_,
      d_seq_rows_;
};

// The step's whole batch: dense rows first, then sparse decode rows; each part attends to its
// own rows. What the transformer's Forward sees.
class StepAttention : public KvAttention {
 public:
  StepAttention(KvAttention* dense, KvAttention* sparse) : dense_(dense), sparse_(sparse) {}
  void Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) override {
    if (dense_ != nullptr) dense_->Attend(layer, q, k, v, out);
    if (sparse_ != nullptr) sparse_->Attend(layer, q, k, v, out);
  }
  RowRange EarlyQueryRows() const override {
    return sparse_ != nullptr ? sparse_->EarlyQueryRows() : RowRange{};
  }
  void PredictLayer(int32_t layer, const Mat& q) override {
    if (sparse_ != nullptr) sparse_->PredictLayer(layer, q);
  }

 private:
  KvAttention* dense_;
  KvAttention* sparse_;
};

}  // namespace specula
