#include "engine/model/transformer.h"

#include <cmath>

#include "absl/strings/str_format.h"
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

// Floats of scratch per token: x, h, qkv, attn, gate_up, act.
static int64_t WorkspaceFloatsPerToken(const ModelConfig& c) {
  return 2 * c.hidden_size + (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() +
         3 * c.intermediate_size;
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

absl::Status Transformer::ValidateBatch(const ForwardBatch& b, const KvPool& kv) const {
  const size_t T = b.tokens.size();
  if (T == 0) return absl::InvalidArgumentError("forward: empty batch");
  if (b.positions.size() != T || b.write_blocks.size() != T || b.write_offsets.size() != T) {
    return absl::InvalidArgumentError("forward: positions / write slots do not match the tokens");
  }
  for (size_t i = 0; i < T; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d is outside the vocabulary [0, %d)", b.tokens[i], config_.vocab_size));
    }
    if (b.write_blocks[i] < 0 || b.write_blocks[i] >= kv.num_blocks() || b.write_offsets[i] < 0 ||
        b.write_offsets[i] >= kv.page_size()) {
      return absl::InvalidArgumentError(absl::StrFormat("forward: bad KV slot for row %d", i));
    }
  }
  // Sequences must tile the rows in order, and each block table must cover its keys.
  int64_t next_row = 0;
  for (const AttentionSeq& a : b.seqs) {
    const int64_t blocks_needed = (static_cast<int64_t>(a.kv_len) + kv.page_size() - 1) /
                                  kv.page_size();
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
  if (next_row != static_cast<int64_t>(T)) {
    return absl::InvalidArgumentError("forward: attention sequences do not cover every row");
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= static_cast<int64_t>(T)) {
      return absl::InvalidArgumentError(absl::StrFormat("forward: bad logit row %d", r));
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::Forward(const ForwardBatch& batch, KvPool& kv,
                                  std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t n_out = static_cast<int64_t>(batch.logit_rows.size());
  RETURN_IF_ERROR(ValidateBatch(batch, kv));
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
  Mat q = qkv.Cols(0, qd), k = qkv.Cols(qd, kvd), v = qkv.Cols(qd + kvd, kvd);

  AttentionBatch ab;
  ab.seqs = batch.seqs;
  ab.blocks = batch.blocks;
  ab.num_heads = heads;
  ab.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  KvWrite where{batch.write_blocks, batch.write_offsets};

  backend_.Embed(batch.tokens, weights_.embed, &x);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    const KvLayerView layer = kv.Layer(static_cast<int32_t>(l));
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
    backend_.WriteKv(k, v, where, layer);
    backend_.PagedAttention(q, ab, layer, &attn);
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
  backend_.CopyToHost(logits->data(), out.data, logits->size() * sizeof(float));
  backend_.Synchronize();
  return absl::OkStatus();
}

}  // namespace specula
