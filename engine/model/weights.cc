#include "engine/model/weights.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace specula {
namespace {

// Loads tensors concatenated along the output dimension as one backend weight, each converted
// once from its checkpoint dtype into the backend's format.
absl::StatusOr<Weight> LoadConcat(const WeightFiles& files, WeightUploader& uploader,
                                  const std::vector<std::pair<std::string, int64_t>>& names,
                                  int64_t in) {
  std::vector<WeightPart> parts;
  int64_t out = 0;
  for (const auto& [name, rows] : names) {
    std::vector<int64_t> shape = in > 0 ? std::vector<int64_t>{rows, in} : std::vector<int64_t>{rows};
    ASSIGN_OR_RETURN(const TensorView* t, files.Require(name, shape));
    parts.push_back({t->dtype, t->data, t->numel()});
    out += rows;
  }
  // Vectors (norms, biases) are stored as [1, n].
  return in > 0 ? uploader.Upload(parts, out, in) : uploader.Upload(parts, 1, out);
}

absl::StatusOr<Weight> LoadMatrix(const WeightFiles& files, WeightUploader& uploader,
                                  const std::string& name, int64_t out, int64_t in) {
  return LoadConcat(files, uploader, {{name, out}}, in);
}

absl::StatusOr<Weight> LoadVector(const WeightFiles& files, WeightUploader& uploader,
                                  const std::string& name, int64_t n) {
  return LoadConcat(files, uploader, {{name, n}}, 0);
}

}  // namespace

size_t ModelWeights::bytes() const {
  size_t total = embed.buffer.bytes() + final_norm.buffer.bytes() + lm_head.buffer.bytes();
  for (const LayerWeights& l : layers) {
    for (const Weight* w : {&l.input_norm, &l.qkv, &l.qkv_bias, &l.q_norm, &l.k_norm, &l.o,
                            &l.o_bias, &l.post_attn_norm, &l.gate_up, &l.gate_up_bias, &l.down,
                            &l.down_bias}) {
      total += w->buffer.bytes();
    }
  }
  return total;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const WeightFiles& files, const ModelConfig& c,
                                              Backend& backend) {
  ModelWeights w;
  const std::unique_ptr<WeightUploader> uploader =
      backend.CreateWeightUploader(kWeightStagingBytes);
  WeightUploader& up = *uploader;
  const int64_t hidden = c.hidden_size;
  ASSIGN_OR_RETURN(w.embed,
                   LoadMatrix(files, up, "model.embed_tokens.weight", c.vocab_size, hidden));
  ASSIGN_OR_RETURN(w.final_norm, LoadVector(files, up, "model.norm.weight", hidden));
  // Some tied checkpoints still carry an lm_head copy; the config decides.
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w.lm_head, LoadMatrix(files, up, "lm_head.weight", c.vocab_size, hidden));
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights l;
    ASSIGN_OR_RETURN(l.input_norm,
                     LoadVector(files, up, p + "input_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(l.qkv, LoadConcat(files, up,
                                       {{p + "self_attn.q_proj.weight", c.q_dim()},
                                        {p + "self_attn.k_proj.weight", c.kv_dim()},
                                        {p + "self_attn.v_proj.weight", c.kv_dim()}},
                                       hidden));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(l.qkv_bias, LoadConcat(files, up,
                                              {{p + "self_attn.q_proj.bias", c.q_dim()},
                                               {p + "self_attn.k_proj.bias", c.kv_dim()},
                                               {p + "self_attn.v_proj.bias", c.kv_dim()}},
                                              0));
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(l.q_norm,
                       LoadVector(files, up, p + "self_attn.q_norm.weight", c.head_dim));
      ASSIGN_OR_RETURN(l.k_norm,
                       LoadVector(files, up, p + "self_attn.k_norm.weight", c.head_dim));
    }
    ASSIGN_OR_RETURN(l.o,
                     LoadMatrix(files, up, p + "self_attn.o_proj.weight", hidden, c.q_dim()));
    if (c.o_proj_bias) {
      ASSIGN_OR_RETURN(l.o_bias, LoadVector(files, up, p + "self_attn.o_proj.bias", hidden));
    }
    ASSIGN_OR_RETURN(l.post_attn_norm,
                     LoadVector(files, up, p + "post_attention_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(l.gate_up, LoadConcat(files, up,
                                           {{p + "mlp.gate_proj.weight", c.intermediate_size},
                                            {p + "mlp.up_proj.weight", c.intermediate_size}},
                                           hidden));
    ASSIGN_OR_RETURN(l.down, LoadMatrix(files, up, p + "mlp.down_proj.weight", hidden,
                                        c.intermediate_size));
    if (c.mlp_bias) {
      ASSIGN_OR_RETURN(l.gate_up_bias, LoadConcat(files, up,
                                                  {{p + "mlp.gate_proj.bias", c.intermediate_size},
                                                   {p + "mlp.up_proj.bias", c.intermediate_size}},
                                                  0));
      ASSIGN_OR_RETURN(l.down_bias, LoadVector(files, up, p + "mlp.down_proj.bias", hidden));
    }
    w.layers.push_back(std::move(l));
  }
  return w;
}

}  // namespace specula
