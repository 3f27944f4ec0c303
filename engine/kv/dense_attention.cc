#include "engine/kv/dense_attention.h"

#include <algorithm>

#include "engine/common/ceil_div.h"
#include "engine/common/check.h"

namespace specula {

void DenseKvAttention::Plan(absl::Span<const DenseSeqRows> seqs, StepPlan& plan) {
  rows_ = 0;
  max_keys_ = 0;
  max_seq_rows_ = 0;
  seqs_ = static_cast<int32_t>(seqs.size());
  size_t table = 0;
  for (const DenseSeqRows& s : seqs) {
    CHECK_EQ(s.q_begin, rows_) << "dense sequences tile the rows in order";
    rows_ += s.q_len;
    table += s.blocks.size();
    max_keys_ = std::max(max_keys_, s.kv_len);
    max_seq_rows_ = std::max(max_seq_rows_, s.q_len);
  }
  if (rows_ == 0) return;
  write_blocks_ = plan.Reserve<int32_t>(rows_);
  write_offsets_ = plan.Reserve<int32_t>(rows_);
  row_keys_ = plan.Reserve<int32_t>(rows_);
  row_begin_ = plan.Reserve<int32_t>(rows_);
  blocks_ = plan.Reserve<int32_t>(std::max<size_t>(table, 1));
  seq_rows_ = plan.Reserve<int32_t>(seqs.size() + 1);
  for (size_t i = 0; i < seqs.size(); ++i) plan.Host(seq_rows_)[i] = seqs[i].q_begin;
  plan.Host(seq_rows_)[seqs.size()] = rows_;
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
  AttentionBatch batch;
  batch.first_row = 0;
  batch.rows = rows_;
  batch.row_keys = d_row_keys_;
  batch.row_block_begin = d_row_begin_;
  batch.blocks = d_blocks_;
  batch.max_keys = max_keys_;
  batch.num_heads = num_heads_;
  batch.scale = softmax_scale_;
  batch.seq_rows = d_seq_rows_;
  batch.seqs = seqs_;
  batch.max_seq_rows = max_seq_rows_;
  backend_.PagedAttention(q, batch, view, out);
}

}  // namespace specula
