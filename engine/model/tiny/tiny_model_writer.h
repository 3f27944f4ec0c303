// Writes deterministic random-weight Hugging Face model directories: the fixtures for every
// supported architecture family and the ~100M-parameter CPU benchmark model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/dtype.h"
#include "engine/model/safetensors.h"

namespace specula {

// Each variant exercises its family's particular features (see WriteTinyModel).
enum class TinyArch { kLlama, kLlama3, kMistral, kQwen2, kQwen3 };

absl::StatusOr<TinyArch> ParseTinyArch(
    const std::string& name);  // llama|llama3|mistral|qwen2|qwen3
std::string TinyArchName(TinyArch arch);

struct TinyModelOptions {
  std::string out_dir;
  TinyArch arch = TinyArch::kLlama;
  std::string preset = "tiny";  // "tiny" or "100m"
  DType dtype = DType::kF32;
  uint64_t seed = 42;
  int shards = 1;
  // Overrides of the preset; 0 keeps the preset's value.
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t max_position_embeddings = 0;
  int64_t vocab = 0;  // must be >= the tokenizer's size
  // Every bias the architecture's attention_bias / mlp_bias can switch on (llama, llama3: q/k/v/o
  // and gate/up/down; qwen3: q/k/v/o), large enough that dropping one changes the logits.
  bool biases = false;
  // "" keeps the architecture's rope; "yarn": yarn scaling (factor 4, a short original context
  // so the ramp crosses the frequencies, transformers' default betas and attention factor).
  std::string rope;
  // "v4": top-level rope_theta + rope_scaling and torch_dtype, as transformers 4 saves;
  // "v5": rope_parameters and dtype, as transformers 5 saves. The weights are the same.
  std::string config_form = "v4";
};

// Writes config.json, model.safetensors (or `shards` files + model.safetensors.index.json),
// tokenizer.json, tokenizer_config.json and generation_config.json into `out_dir` (created if
// needed; weight files left from an earlier run are removed). Same options -> identical bytes.
//   llama:   LlamaForCausalLM, Llama-2-like: no rope scaling, untied lm_head, rope_theta 1e4.
//   llama3:  LlamaForCausalLM, rope_scaling llama3 (factor 8, low 1, high 4, original max
//            positions 64 for tiny), rope_theta 5e5, tied embeddings, explicit head_dim.
//   mistral: MistralForCausalLM, sliding_window null, untied.
//   qwen2:   Qwen2ForCausalLM, random nonzero q/k/v biases, tied embeddings, ChatML tokens.
//   qwen3:   Qwen3ForCausalLM, q_norm/k_norm, head_dim != hidden/heads, tied, ChatML tokens.
// Options `biases`, `rope` and `config_form` vary one thing each.
absl::Status WriteTinyModel(const TinyModelOptions& options);

// Writes `text` to `path` (replacing it); INTERNAL naming the path when that fails.
absl::Status WriteTextFile(const std::string& path, const std::string& text);

// The weights WriteTinyModel writes for `options`, in file order.
absl::StatusOr<std::vector<TensorToWrite>> MakeTinyWeights(const TinyModelOptions& options);

}  // namespace specula
