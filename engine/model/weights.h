// A Llama-family model's weights on a backend, loaded from a Hugging Face directory.
// Q/K/V and gate/up projections are concatenated so each is one GEMM.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace specula {

struct LayerWeights {
  Weight input_norm;      // [1, hidden]
  Weight qkv;             // [q_dim + 2 kv_dim, hidden]
  Weight qkv_bias;        // [1, q_dim + 2 kv_dim] or empty
  Weight q_norm;          // [1, head_dim] or empty (Qwen3)
  Weight k_norm;          // [1, head_dim] or empty
  Weight o;               // [hidden, q_dim]
  Weight o_bias;          // [1, hidden] or empty (Llama, Qwen3 with attention_bias)
  Weight post_attn_norm;  // [1, hidden]
  Weight gate_up;         // [2 intermediate, hidden]
  Weight gate_up_bias;    // [1, 2 intermediate] or empty (Llama with mlp_bias)
  Weight down;            // [hidden, intermediate]
  Weight down_bias;       // [1, hidden] or empty
};

struct ModelWeights {
  Weight embed;       // [vocab, hidden]
  Weight final_norm;  // [1, hidden]
  Weight lm_head;     // [vocab, hidden]; empty when tied to `embed`
  std::vector<LayerWeights> layers;

  const Weight& output() const { return lm_head.empty() ? embed : lm_head; }
  // Backend storage of every weight.
  size_t bytes() const;
  // What one decode step reads: every weight but the embedding table, of which only a few rows
  // are gathered (unless it doubles as the output projection).
  size_t decode_bytes_per_token() const {
    return bytes() - (lm_head.empty() ? 0 : embed.buffer.bytes());
  }
};

// Every tensor the config implies must be present with its exact shape; errors name the file and
// the tensor. Tensors the model does not use are ignored.
absl::StatusOr<ModelWeights> LoadModelWeights(const WeightFiles& files, const ModelConfig& config,
                                              Backend& backend);

}  // namespace specula
