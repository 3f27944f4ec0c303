#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/status_macros.h"
#include "engine/model/rope.h"
#include "engine/model/safetensors.h"

namespace specula {

void ForwardBatch::Clear() {
  tokens.clear();
  positions.clear();
  seqs.clear();
  blocks.clear();
  write_blocks.clear();
  write_offsets.clear();
  sparse_prefill.clear();
  sparse_decode.clear();
  logit_rows.clear();
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& model_dir,
                                                               Backend& backend) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<WeightFiles> files, WeightFiles::OpenDirectory(model_dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(*files, config, backend));
  return std::unique_ptr<Transformer>(
      new Transformer(std::move(config), std::move(weights), backend));
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, Backend& backend)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(backend) {
  inv_freq_ = RopeInverseFrequencies(config_);
}

// Floats of scratch per token: x, h, qkv, attn, gate_up, act, and the cross_layer prediction's
// h and qkv.
static int64_t WorkspaceFloatsPerToken(const ModelConfig& c) {
  return 2 * c.hidden_size + (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() +
         3 * c.intermediate_size + c.hidden_size + (c.q_dim() + 2 * c.kv_dim());
}

absl::Status Transformer::Reserve(int64_t tokens, int64_t logit_rows) {
  if (tokens <= workspace_tokens_ && logit_rows <= workspace_logit_rows_) return absl::OkStatus();
  tokens = std::max(tokens, workspace_tokens_);
  logit_rows = std::max(logit_rows, workspace_logit_rows_);
  const int64_t floats = tokens * WorkspaceFloatsPerToken(config_) +
                         logit_rows * (config_.hidden_size + config_.vocab_size);
  ASSIGN_OR_RETURN(workspace_, backend_.Allocate(static_cast<size_t>(floats) * sizeof(float)));
  workspace_tokens_ = tokens;
  workspace_logit_rows_ = logit_rows;
  return absl::OkStatus();
}

absl::Status Transformer::ValidateBatch(const ForwardBatch& b, const KvPool& kv,
                                        const SparseKvCache* sparse) const {
  const size_t T = b.tokens.size();
  const size_t dense = b.write_blocks.size();
  if (T == 0) return absl::InvalidArgumentError("forward: empty batch");
  if (b.positions.size() != T || dense > T || b.write_offsets.size() != dense) {
    return absl::InvalidArgumentError("forward: positions / write slots do not match the tokens");
  }
  for (size_t i = 0; i < T; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d is outside the vocabulary [0, %d)", b.tokens[i], config_.vocab_size));
    }
  }
  for (size_t i = 0; i < dense; ++i) {
    if (b.write_blocks[i] < 0 || b.write_blocks[i] >= kv.num_blocks() || b.write_offsets[i] < 0 ||
        b.write_offsets[i] >= kv.page_size()) {
      return absl::InvalidArgumentError(absl::StrFormat("forward: bad KV slot for row %d", i));
    }
  }
  // Sequences must tile the rows in order, and each block table must cover its keys.
  int64_t next_row = 0;
  for (const AttentionSeq& a : b.seqs) {
    const int64_t blocks_needed = CeilDiv(a.kv_len, kv.page_size());
    if (a.q_begin != next_row || a.q_len <= 0 || a.kv_len < a.q_len || a.block_begin < 0 ||
        a.block_begin + blocks_needed > static_cast<int64_t>(b.blocks.size())) {
      return absl::InvalidArgumentError("forward: inconsistent attention sequence metadata");
    }
    for (int64_t i = 0; i < blocks_needed; ++i) {
      const int32_t blk = b.blocks[a.block_begin + i];
      if (blk < 0 || blk >= kv.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrFormat("forward: bad block id %d", blk));
      }
    }
    next_row += a.q_len;
  }
  if (next_row != static_cast<int64_t>(dense)) {
    return absl::InvalidArgumentError("forward: attention sequences do not cover the dense rows");
  }
  if ((!b.sparse_prefill.empty() || !b.sparse_decode.empty()) && sparse == nullptr) {
    return absl::InvalidArgumentError("forward: sparse rows without a sparse KV cache");
  }
  std::vector<const WorkingSet*> seen;
  for (const auto* runs : {&b.sparse_decode, &b.sparse_prefill}) {
    for (const SparseRows& r : *runs) {
      const bool decode = runs == &b.sparse_decode;
      if (r.ws == nullptr || !sparse->Owns(r.ws) || r.q_begin != next_row || r.q_len <= 0 ||
          (decode && r.q_len != 1) || r.prefill == decode ||
          r.q_begin + r.q_len > static_cast<int64_t>(T) || b.positions[r.q_begin] != r.start ||
          r.start + r.q_len > r.ws->host().capacity_tokens() ||
          (decode && r.ws->window_begin < 0) || (!decode && r.start + r.q_len > r.ws->prompt_tokens()) ||
          std::find(seen.begin(), seen.end(), r.ws) != seen.end()) {
        return absl::InvalidArgumentError("forward: inconsistent sparse row metadata");
      }
      for (int32_t i = 1; i < r.q_len; ++i) {
        if (b.positions[r.q_begin + i] != r.start + i) {
          return absl::InvalidArgumentError("forward: sparse rows' positions are not consecutive");
        }
      }
      seen.push_back(r.ws);
      next_row += r.q_len;
    }
  }
  if (next_row != static_cast<int64_t>(T)) {
    return absl::InvalidArgumentError("forward: the batch's sequences do not cover every row");
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= static_cast<int64_t>(T)) {
      return absl::InvalidArgumentError(absl::StrFormat("forward: bad logit row %d", r));
    }
  }
  return absl::OkStatus();
}

void Transformer::PredictSparseLayer(int64_t next, const ForwardBatch& batch, const Mat& x,
                                     Mat h, Mat qkv, SparseKvCache& sparse) {
  const ModelConfig& c = config_;
  const int32_t hd = static_cast<int32_t>(c.head_dim);
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  const int64_t first = batch.sparse_decode.front().q_begin;
  const int64_t n = static_cast<int64_t>(batch.sparse_decode.size());
  const LayerWeights& w = weights_.layers[next];
  h = h.Rows(0, n);
  qkv = qkv.Rows(0, n);
  backend_.RmsNorm(x.Rows(first, n), w.input_norm, static_cast<float>(c.rms_norm_eps), &h);
  backend_.Gemm(h, w.qkv, w.qkv_bias, &qkv);
  Mat q = qkv.Cols(0, c.q_dim());
  if (c.qk_norm) {
    for (int32_t i = 0; i < heads; ++i) {
      Mat qh = q.Cols(static_cast<int64_t>(i) * hd, hd);
      backend_.RmsNorm(qh, w.q_norm, static_cast<float>(c.rms_norm_eps), &qh);
    }
  }
  backend_.Rope(&q, heads, hd, absl::MakeConstSpan(batch.positions).subspan(first, n), inv_freq_);
  std::vector<float> span, host(static_cast<size_t>(n * c.q_dim()));
  ReadRowsToHost(backend_, q, &span);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(span.data() + r * q.stride, c.q_dim(), host.data() + r * c.q_dim());
  }
  sparse.PredictLayer(static_cast<int32_t>(next), batch.sparse_decode, host);
}

absl::Status Transformer::Forward(const ForwardBatch& batch, KvPool& kv, SparseKvCache* sparse,
                                  std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t n_out = static_cast<int64_t>(batch.logit_rows.size());
  RETURN_IF_ERROR(ValidateBatch(batch, kv, sparse));
  RETURN_IF_ERROR(Reserve(T, n_out));

  const int64_t H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size;
  const int32_t hd = static_cast<int32_t>(c.head_dim);
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  const int32_t kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  const float eps = static_cast<float>(c.rms_norm_eps);

  float* p = workspace_.as<float>();
  auto take = [&](int64_t rows, int64_t cols) {
    Mat m(p, rows, cols);
    p += rows * cols;
    return m;
  };
  Mat x = take(T, H), h = take(T, H), qkv = take(T, qd + 2 * kvd), attn = take(T, qd);
  Mat gate_up = take(T, 2 * I), act = take(T, I);
  Mat predict_h = take(T, H), predict_qkv = take(T, qd + 2 * kvd);
  Mat q = qkv.Cols(0, qd), k = qkv.Cols(qd, kvd), v = qkv.Cols(qd + kvd, kvd);

  AttentionBatch ab;
  ab.seqs = batch.seqs;
  ab.blocks = batch.blocks;
  ab.num_heads = heads;
  ab.scale = AttentionScale(hd);
  KvWrite where{batch.write_blocks, batch.write_offsets};
  const int64_t dense_rows = batch.dense_rows();
  const bool predict_layers = sparse != nullptr && !batch.sparse_decode.empty() &&
                              sparse->wants_layer_prediction();

  if (sparse != nullptr) sparse->BeginDecodeStep(batch.sparse_decode);
  backend_.Embed(batch.tokens, weights_.embed, &x);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    const KvLayerView layer = kv.Layer(static_cast<int32_t>(l));
    if (predict_layers && l + 1 < c.num_hidden_layers) {
      // Before this layer's work, so the prefetch overlaps it.
      PredictSparseLayer(l + 1, batch, x, predict_h, predict_qkv, *sparse);
    }
    backend_.RmsNorm(x, w.input_norm, eps, &h);
    backend_.Gemm(h, w.qkv, w.qkv_bias, &qkv);
    if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
      for (int32_t i = 0; i < heads; ++i) {
        Mat qh = q.Cols(static_cast<int64_t>(i) * hd, hd);
        backend_.RmsNorm(qh, w.q_norm, eps, &qh);
      }
      for (int32_t i = 0; i < kv_heads; ++i) {
        Mat kh = k.Cols(static_cast<int64_t>(i) * hd, hd);
        backend_.RmsNorm(kh, w.k_norm, eps, &kh);
      }
    }
    backend_.Rope(&q, heads, hd, batch.positions, inv_freq_);
    backend_.Rope(&k, kv_heads, hd, batch.positions, inv_freq_);
    if (dense_rows > 0) {
      backend_.WriteKv(k.Rows(0, dense_rows), v.Rows(0, dense_rows), where, layer);
      backend_.PagedAttention(q, ab, layer, &attn);
    }
    if (sparse != nullptr) {
      sparse->Prefill(static_cast<int32_t>(l), batch.sparse_prefill, q, k, v, &attn);
      sparse->Decode(static_cast<int32_t>(l), batch.sparse_decode, q, k, v, &attn);
    }
    backend_.Gemm(attn, w.o, Weight{}, &h);
    backend_.Add(&x, h);
    backend_.RmsNorm(x, w.post_attn_norm, eps, &h);
    backend_.Gemm(h, w.gate_up, Weight{}, &gate_up);
    backend_.SwiGlu(gate_up, &act);
    backend_.Gemm(act, w.down, Weight{}, &h);
    backend_.Add(&x, h);
  }

  logits->resize(static_cast<size_t>(n_out * c.vocab_size));
  if (n_out == 0) return absl::OkStatus();
  Mat last = take(n_out, H), out = take(n_out, c.vocab_size);
  backend_.GatherRows(x, batch.logit_rows, &last);
  backend_.RmsNorm(last, weights_.final_norm, eps, &last);
  backend_.Gemm(last, weights_.output(), Weight{}, &out);
  // The step's one host synchronization (CopyToHost waits for the compute stream).
  backend_.CopyToHost(logits->data(), out.data, logits->size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace specula
