// Typed view of a Hugging Face `config.json` and `generation_config.json`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/dtype.h"

namespace specula {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

// "LlamaForCausalLM", ... ; the name as it appears in config.json's `architectures`.
std::string ArchitectureName(Architecture a);
absl::StatusOr<Architecture> ParseArchitecture(const std::string& name);

// The rotary embedding's scaling, from `rope_parameters` (transformers 5) or `rope_scaling`
// (transformers 4); both forms mean the same thing (docs/ENGINE_CORE.md, "Model configuration").
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  double beta_fast = 32.0;                          // yarn
  double beta_slow = 1.0;                           // yarn
  bool truncate = true;                             // yarn: integer correction range
  // What cos and sin are multiplied by (transformers' `attention_scaling`): yarn's attention
  // factor or its mscale ratio, 1 otherwise. Queries and keys both carry it, so attention
  // logits are scaled by its square (ModelConfig::softmax_scale).
  double attention_factor = 1.0;
};

// The longest context a config.json may declare (max_position_embeddings); more is a load error.
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 30;

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads when absent
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads when absent
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases: always for Qwen2, `attention_bias` key otherwise
  bool o_proj_bias = false;     // Llama and Qwen3 with `attention_bias`
  bool mlp_bias = false;        // gate/up/down biases: Llama's `mlp_bias`
  bool qk_norm = false;         // per-head RMSNorm of q and k: Qwen3
  DType torch_dtype = DType::kF32;  // `dtype` (transformers 5) or `torch_dtype`
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // `eos_token_id`: int or list
  // Top-level keys specula neither reads nor knows to be inert, sorted: accepted, and named in
  // one warning line at load (LoadModelConfig).
  std::vector<std::string> unrecognized_keys;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // The softmax scale of attention: 1/sqrt(head_dim), times the square of the rotary
  // embedding's attention factor (transformers scales cos and sin, so both q and k, by it).
  float softmax_scale() const;
};

// Parses and validates config.json text as transformers 4 and 5 write it, with each
// architecture's defaults as in transformers' config classes. `source` names the file in error
// messages. Every key that changes the computation is honoured or refused: unknown
// architectures, `hidden_act` other than silu, rope types other than default/linear/llama3/yarn,
// sliding windows shorter than the context, quantization, partial rotary embeddings, the two
// forms of one setting disagreeing (rope_parameters vs rope_theta/rope_scaling, dtype vs
// torch_dtype), non-positive sizes, heads not dividing evenly into KV heads: INVALID_ARGUMENT
// naming the file and the key. The key lists are in docs/ENGINE_CORE.md.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
// Reads `model_dir`/config.json; logs one warning naming its unrecognized keys, if any.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // int or list in the file
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  // Sampling defaults the model ships with; absent keys stay unset.
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
};

absl::StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                       const std::string& source);
// A missing generation_config.json is not an error: the result is empty.
absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& model_dir);

}  // namespace specula
