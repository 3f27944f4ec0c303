#include "engine/model/transformer.h"

#include <algorithm>

#include "engine/common/check.h"
#include "engine/common/status_macros.h"
#include "engine/model/rope.h"
#include "engine/model/safetensors.h"

namespace specula {

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& model_dir,
                                                               Backend& backend) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<WeightFiles> files, WeightFiles::OpenDirectory(model_dir));
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(*files, config, backend));
  std::unique_ptr<Transformer> t(new Transformer(std::move(config), std::move(weights), backend));
  const std::vector<float> inv_freq = RopeInverseFrequencies(t->config_);
  ASSIGN_OR_RETURN(t->inv_freq_, backend.Allocate(inv_freq.size() * sizeof(float)));
  backend.CopyToDevice(t->inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
  return t;
}

Transformer::Transformer(ModelConfig config, ModelWeights weights, Backend& backend)
    : config_(std::move(config)), weights_(std::move(weights)), backend_(backend) {}

absl::Status Transformer::Reserve(int64_t rows, int64_t logit_rows) {
  if (rows <= reserved_rows_ && logit_rows <= reserved_logit_rows_) return absl::OkStatus();
  rows = std::max(rows, reserved_rows_);
  logit_rows = std::max(logit_rows, reserved_logit_rows_);
  const ModelConfig& c = config_;
  const int64_t qkv = c.q_dim() + 2 * c.kv_dim();
  // x, h, qkv, attn, gate_up, act, and the cross_layer prediction's h and qkv, per row; the
  // gathered last rows and their logits per logit row.
  const int64_t per_row =
      2 * c.hidden_size + qkv + c.q_dim() + 3 * c.intermediate_size + c.hidden_size + qkv;
  const int64_t floats = rows * per_row + logit_rows * (c.hidden_size + c.vocab_size);
  ASSIGN_OR_RETURN(workspace_, backend_.Allocate(static_cast<size_t>(floats) * sizeof(float)));
  ++workspace_generation_;
  float* p = workspace_.as<float>();
  auto take = [&](int64_t n, int64_t cols) {
    Mat m(p, n, cols);
    p += n * cols;
    return m;
  };
  x_ = take(rows, c.hidden_size);
  h_ = take(rows, c.hidden_size);
  qkv_ = take(rows, qkv);
  attn_ = take(rows, c.q_dim());
  gate_up_ = take(rows, 2 * c.intermediate_size);
  act_ = take(rows, c.intermediate_size);
  predict_h_ = take(rows, c.hidden_size);
  predict_qkv_ = take(rows, qkv);
  last_ = take(logit_rows, c.hidden_size);
  logits_ = take(logit_rows, c.vocab_size);
  reserved_rows_ = rows;
  reserved_logit_rows_ = logit_rows;
  return absl::OkStatus();
}

Mat Transformer::hidden(int64_t rows) const { return x_.Rows(0, rows); }

Mat Transformer::logits(int64_t rows) const {
  CHECK_LE(rows, reserved_logit_rows_);
  return logits_.Rows(0, rows);
}

void Transformer::Embed(DeviceSpan<const int32_t> tokens, Mat* x) {
  backend_.Embed(tokens, weights_.embed, x);
}

void Transformer::ProjectQkv(int32_t layer, const Mat& normed, DeviceSpan<const int32_t> positions,
                             Mat* qkv, bool keys) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[layer];
  const int32_t hd = static_cast<int32_t>(c.head_dim);
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  const int32_t kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  backend_.Gemm(normed, w.qkv, w.qkv_bias, qkv);
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
    Mat q = qkv->Cols(0, c.q_dim());
    backend_.HeadRmsNorm(&q, heads, hd, w.q_norm, norm_eps());
    if (keys) {
      Mat k = qkv->Cols(c.q_dim(), c.kv_dim());
      backend_.HeadRmsNorm(&k, kv_heads, hd, w.k_norm, norm_eps());
    }
  }
  // q and k are adjacent columns, so one launch rotates both.
  Mat rotated = qkv->Cols(0, c.q_dim() + (keys ? c.kv_dim() : 0));
  const DeviceSpan<const float> inv_freq(inv_freq_.as<const float>(), hd / 2);
  backend_.Rope(&rotated, heads + (keys ? kv_heads : 0), hd, positions, inv_freq);
}

void Transformer::PredictLayer(int32_t next, const Mat& x, DeviceSpan<const int32_t> positions,
                               KvAttention& attention) {
  const RowRange rows = attention.EarlyQueryRows();
  Mat h = predict_h_.Rows(0, rows.count);
  Mat qkv = predict_qkv_.Rows(0, rows.count);
  backend_.RmsNorm(x.Rows(rows.first, rows.count), weights_.layers[next].input_norm, norm_eps(),
                   &h);
  ProjectQkv(next, h,
             positions.subspan(static_cast<size_t>(rows.first), static_cast<size_t>(rows.count)),
             &qkv, /*keys=*/false);
  attention.PredictLayer(next, qkv.Cols(0, config_.q_dim()));
}

void Transformer::LayerBody(int32_t layer, Mat* x, Mat* h, DeviceSpan<const int32_t> positions,
                            KvAttention& attention) {
  const ModelConfig& c = config_;
  const int64_t n = x->rows;
  const LayerWeights& w = weights_.layers[layer];
  Mat qkv = qkv_.Rows(0, n), attn = attn_.Rows(0, n);
  Mat gate_up = gate_up_.Rows(0, n), act = act_.Rows(0, n);
  ProjectQkv(layer, *h, positions, &qkv, /*keys=*/true);
  attention.Attend(layer, qkv.Cols(0, c.q_dim()), qkv.Cols(c.q_dim(), c.kv_dim()),
                   qkv.Cols(c.q_dim() + c.kv_dim(), c.kv_dim()), &attn);
  backend_.Gemm(attn, w.o, w.o_bias, h);
  backend_.AddRmsNorm(x, *h, w.post_attn_norm, norm_eps(), h);
  backend_.Gemm(*h, w.gate_up, w.gate_up_bias, &gate_up);
  backend_.SwiGlu(gate_up, &act);
  backend_.Gemm(act, w.down, w.down_bias, h);
}

void Transformer::ForwardLayer(int32_t layer, Mat* x, DeviceSpan<const int32_t> positions,
                               KvAttention& attention) {
  const int64_t n = x->rows;
  CHECK_LE(n, reserved_rows_) << "Transformer::Reserve was not called for this many rows";
  Mat h = h_.Rows(0, n);
  backend_.RmsNorm(*x, weights_.layers[layer].input_norm, norm_eps(), &h);
  LayerBody(layer, x, &h, positions, attention);
  backend_.Add(x, h);
}

void Transformer::Forward(DeviceSpan<const int32_t> tokens, DeviceSpan<const int32_t> positions,
                          KvAttention& attention) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  CHECK_LE(n, reserved_rows_) << "Transformer::Reserve was not called for this many rows";
  Mat x = x_.Rows(0, n), h = h_.Rows(0, n);
  Embed(tokens, &x);
  const int32_t layers = static_cast<int32_t>(config_.num_hidden_layers);
  const bool predict = !attention.EarlyQueryRows().empty();
  for (int32_t l = 0; l < layers; ++l) {
    // The previous layer's MLP output joins the residual stream in this layer's input norm.
    const Weight& norm = weights_.layers[l].input_norm;
    if (l == 0) {
      backend_.RmsNorm(x, norm, norm_eps(), &h);
    } else {
      backend_.AddRmsNorm(&x, h, norm, norm_eps(), &h);
    }
    // Before this layer's work, so the prefetch of the next layer's pages overlaps it.
    if (predict && l + 1 < layers) PredictLayer(l + 1, x, positions, attention);
    LayerBody(l, &x, &h, positions, attention);
  }
  if (layers > 0) backend_.Add(&x, h);
}

void Transformer::Logits(const Mat& x, DeviceSpan<const int32_t> rows, int64_t first) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  CHECK_LE(first + n, reserved_logit_rows_) << "Transformer::Reserve: too few logit rows";
  Mat last = last_.Rows(first, n), out = logits_.Rows(first, n);
  backend_.GatherRows(x, rows, &last);
  backend_.RmsNorm(last, weights_.final_norm, norm_eps(), &last);
  backend_.Gemm(last, weights_.output(), Weight{}, &out);
}

void Transformer::ReadLogits(int64_t n, std::vector<float>* logits) {
  logits->resize(static_cast<size_t>(n * config_.vocab_size));
  if (n == 0) return;
  CHECK_LE(n, reserved_logit_rows_);
  backend_.CopyToHost(logits->data(), logits_.data, logits->size() * sizeof(float));
}

}  // namespace specula
