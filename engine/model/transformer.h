// The decoder-only transformer forward pass (Llama, Mistral, Qwen2, Qwen3), written once against
// the Backend interface. It sees the KV cache only through KvAttention, per layer.
//
// Two ways to run it:
// - Forward: a step's rows (decode tokens and prefill chunks of many sequences) through every
//   layer, token-major;
// - Embed, ForwardLayer and Logits: the pieces, for layer-major prefill (one layer over a whole
//   prompt, chunk by chunk, before the next layer).
// Logits are written to backend memory and read back by ReadLogits, the step's one
// synchronization. Metadata (token ids, positions, logit rows) comes as DeviceSpans of the step's
// plan (engine/backend/step_plan.h).
//
// Owned and called by one engine thread. Nothing here allocates after Reserve.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/model/kv_attention.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace specula {

class Transformer {
 public:
  // Reads config.json and the safetensors weights of `model_dir` onto `backend`, which must
  // outlive the Transformer.
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& model_dir,
                                                           Backend& backend);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() const { return backend_; }

  // Sizes the scratch memory for up to `rows` rows per pass and `logit_rows` logit rows, so that
  // the calls below never allocate (and so never fail for memory mid-request).
  absl::Status Reserve(int64_t rows, int64_t logit_rows);

  // Runs `rows` tokens (ids and positions in backend memory) through every layer; their final
  // hidden states are then hidden(rows).
  void Forward(DeviceSpan<const int32_t> tokens, DeviceSpan<const int32_t> positions,
               KvAttention& attention);
  // The hidden states Forward left, [rows, hidden].
  Mat hidden(int64_t rows) const;
  // Logit rows [0, rows) in backend memory (what Logits wrote), [rows, vocab].
  Mat logits(int64_t rows) const;
  // Counts reallocations of the scratch memory (Reserve growing it).
  uint64_t workspace_generation() const { return workspace_generation_; }

  // x[i] = embedding of tokens[i].
  void Embed(DeviceSpan<const int32_t> tokens, Mat* x);
  // One decoder layer on x in place (x.rows <= the reserved rows).
  void ForwardLayer(int32_t layer, Mat* x, DeviceSpan<const int32_t> positions,
                    KvAttention& attention);
  // Logits of x's rows `rows` (final norm, output projection) into logit rows
  // [first, first + rows.size()).
  void Logits(const Mat& x, DeviceSpan<const int32_t> rows, int64_t first);
  // Reads logit rows [0, n) to the host, row-major [n, vocab]: waits for the compute stream.
  void ReadLogits(int64_t n, std::vector<float>* logits);

 private:
  Transformer(ModelConfig config, ModelWeights weights, Backend& backend);
  float norm_eps() const { return static_cast<float>(config_.rms_norm_eps); }
  // Layer `layer`'s q, k, v into qkv from its normed input (projection, Qwen3's q/k norm, RoPE;
  // k is normed and rotated only with `keys`).
  void ProjectQkv(int32_t layer, const Mat& normed, DeviceSpan<const int32_t> positions, Mat* qkv,
                  bool keys);
  // Layer `layer` on x, given its input norm in *h: attention, the output projection added to x
  // (fused with the post-attention norm), the MLP. The MLP's output is left in *h, not yet added
  // to x, so the next layer's input norm can fuse the add.
  void LayerBody(int32_t layer, Mat* x, Mat* h, DeviceSpan<const int32_t> positions,
                 KvAttention& attention);
  // cross_layer speculation: layer `next`'s queries from layer next - 1's input x, for the rows
  // the attention asks for.
  void PredictLayer(int32_t next, const Mat& x, DeviceSpan<const int32_t> positions,
                    KvAttention& attention);

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  DeviceBuffer inv_freq_;  // RoPE inverse frequencies, head_dim / 2 floats
  int64_t reserved_rows_ = 0;
  int64_t reserved_logit_rows_ = 0;
  DeviceBuffer workspace_;
  uint64_t workspace_generation_ = 0;
  // Views of workspace_, for reserved_rows_ rows.
  Mat x_, h_, qkv_, attn_, gate_up_, act_, predict_h_, predict_qkv_, last_, logits_;
};

}  // namespace specula
