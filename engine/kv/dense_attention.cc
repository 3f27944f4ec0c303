#include "engine/kv/dense_attention.h"

#include <algorithm>

#include "engine/common/ceil_div.h"
#include "engine/common/check.h"

namespace specula {

void DenseKvAttention::Plan(absl::Span<const DenseSeqRows> seqs, StepPlan& plan,
                            int32_t decode_keys_capacity) {
  rows_ = 0;
  size_t table = 0;
  // The leading one-row sequences (the scheduler puts decode rows first) attend on their own,
  // so that a GPU keeps them on its decode kernel when a prefill chunk shares the step.
  size_t single = 0;
  while (single < seqs.size() && seqs[single].q_len == 1) ++single;
  decode_ = Part{};
  chunks_ = Part{};
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DenseSeqRows& s = seqs[i];
    CHECK_EQ(s.q_begin, rows_) << "dense sequences tile the rows in order";
    rows_ += s.q_len;
    table += s.blocks.size();
    Part& part = i < single ? decode_ : chunks_;
    part.rows += s.q_len;
    part.max_keys = std::max(part.max_keys, s.kv_len);
    part.max_seq_rows = std::max(part.max_seq_rows, s.q_len);
  }
  if (rows_ == 0) return;
  if (decode_keys_capacity > 0) {
    CHECK_EQ(decode_.rows, rows_) << "a keys capacity is for steps of decode rows only";
    CHECK_LE(decode_.max_keys, decode_keys_capacity);
    decode_.max_keys = decode_keys_capacity;
    table = std::max<size_t>(
        table, static_cast<size_t>(rows_) * CeilDiv(decode_keys_capacity, pool_.page_size()));
  }
  chunks_.first_row = decode_.rows;
  chunks_.seqs = static_cast<int32_t>(seqs.size() - single);
  write_blocks_ = plan.Reserve<int32_t>(rows_);
  write_offsets_ = plan.Reserve<int32_t>(rows_);
  row_keys_ = plan.Reserve<int32_t>(rows_);
  row_begin_ = plan.Reserve<int32_t>(rows_);
  blocks_ = plan.Reserve<int32_t>(std::max<size_t>(table, 1));
  seq_rows_ = plan.Reserve<int32_t>(chunks_.seqs + 1);  // relative to the chunks' first row
  for (size_t i = single; i < seqs.size(); ++i) {
    plan.Host(seq_rows_)[i - single] = seqs[i].q_begin - chunks_.first_row;
  }
  plan.Host(seq_rows_)[chunks_.seqs] = chunks_.rows;
  const int32_t ps = pool_.page_size();
  int32_t* block_at = plan.Host(blocks_);
  int32_t table_begin = 0;
  for (const DenseSeqRows& s : seqs) {
    CHECK_GE(static_cast<int64_t>(s.blocks.size()), CeilDiv(s.kv_len, ps));
    std::copy(s.blocks.begin(), s.blocks.end(), block_at + table_begin);
    for (int32_t i = 0; i < s.q_len; ++i) {
      const int32_t row = s.q_begin + i;
      const int32_t pos = s.kv_len - s.q_len + i;
      plan.Host(write_blocks_)[row] = s.blocks[pos / ps];
      plan.Host(write_offsets_)[row] = pos % ps;
      plan.Host(row_keys_)[row] = pos + 1;
      plan.Host(row_begin_)[row] = table_begin;
    }
    table_begin += static_cast<int32_t>(s.blocks.size());
  }
}

void DenseKvAttention::Bind(const StepPlan& plan) {
  if (rows_ == 0) return;
  d_write_blocks_ = plan.Device(write_blocks_);
  d_write_offsets_ = plan.Device(write_offsets_);
  d_row_keys_ = plan.Device(row_keys_);
  d_row_begin_ = plan.Device(row_begin_);
  d_blocks_ = plan.Device(blocks_);
  d_seq_rows_ = plan.Device(seq_rows_);
}

void DenseKvAttention::Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) {
  if (rows_ == 0) return;
  const KvLayerView view = pool_.Layer(layer);
  backend_.WriteKv(k.Rows(0, rows_), v.Rows(0, rows_), KvWrite{d_write_blocks_, d_write_offsets_},
                   view);
  AttendPart(decode_, q, view, out);
  AttendPart(chunks_, q, view, out);
}

void DenseKvAttention::AttendPart(const Part& part, const Mat& q, const KvLayerView& view,
                                  Mat* out) {
  if (part.rows == 0) return;
  AttentionBatch batch;
  batch.first_row = part.first_row;
  batch.rows = part.rows;
  batch.row_keys = d_row_keys_.subspan(part.first_row, part.rows);
  batch.row_block_begin = d_row_begin_.subspan(part.first_row, part.rows);
  batch.blocks = d_blocks_;
  batch.max_keys = part.max_keys;
  batch.num_heads = num_heads_;
  batch.scale = softmax_scale_;
  if (part.seqs > 0) {  // the chunks; the decode rows are attended without sequences
    batch.seq_rows = d_seq_rows_;
    batch.seqs = part.seqs;
    batch.max_seq_rows = part.max_seq_rows;
  }
  backend_.PagedAttention(q, batch, view, out);
}

}  // namespace specula
