#include "engine/model/config_keys.h"

namespace specula {

const std::set<std::string>& ReadConfigKeys() {
  static const std::set<std::string> keys = {
      "architectures",       "hidden_act",         "quantization_config",
      "auto_map",            "is_encoder_decoder", "hidden_size",
      "intermediate_size",   "num_hidden_layers",  "num_attention_heads",
      "num_key_value_heads", "head_dim",           "vocab_size",
      "max_position_embeddings", "rms_norm_eps",   "rope_parameters",
      "rope_theta",          "rope_scaling",       "partial_rotary_factor",
      "original_max_position_embeddings", "use_sliding_window", "sliding_window",
      "max_window_layers",   "layer_types",        "tie_word_embeddings",
      "attention_bias",      "mlp_bias",           "dtype",
      "torch_dtype",         "bos_token_id",       "eos_token_id",
  };
  return keys;
}

// Checked against transformers 5's configuration and modeling code of Llama, Mistral, Qwen2 and
// Qwen3: identity and bookkeeping, training-only settings (dropout, initialisation, tensor
// parallel slicing that computes the same product), and output flags.
const std::set<std::string>& InertConfigKeys() {
  static const std::set<std::string> keys = {
      "model_type",          "transformers_version", "_name_or_path",
      "_commit_hash",        "initializer_range",    "use_cache",
      "attention_dropout",   "pretraining_tp",       "pad_token_id",
      "output_hidden_states", "output_attentions",   "return_dict",
      "torchscript",         "use_bfloat16",         "chunk_size_feed_forward",
      "id2label",            "label2id",             "problem_type",
      "tokenizer_class",     "_attn_implementation_autoset", "tf_legacy_loss",
      "pruned_heads",        "finetuning_task",      "task_specific_params",
  };
  return keys;
}

std::vector<std::string> UnrecognizedConfigKeys(const nlohmann::json& root) {
  std::vector<std::string> out;
  for (const auto& [key, value] : root.items()) {
    if (!ReadConfigKeys().contains(key) && !InertConfigKeys().contains(key)) out.push_back(key);
  }
  return out;  // nlohmann::json objects iterate in key order
}

}  // namespace specula
