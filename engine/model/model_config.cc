#include "engine/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/bounded_file.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "engine/common/status_macros.h"
#include "engine/model/config_keys.h"
#include "engine/model/config_reader.h"
#include "engine/model/rope_config.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using model_internal::ConfigReader;
using model_internal::Json;

absl::StatusOr<Json> ParseObject(const std::string& text, const std::string& source) {
  Json json;
  try {
    json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (json.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  return json;
}


bool IsQwen(Architecture a) { return a == Architecture::kQwen2 || a == Architecture::kQwen3; }

// The first architecture of `architectures`, which must list exactly one.
absl::StatusOr<Architecture> ReadArchitecture(const ConfigReader& r) {
  const Json* archs = r.Get("architectures");
  if (archs == nullptr) return r.Error("architectures", "required key is missing");
  if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
    return r.Error("architectures", "must be a list of exactly one name");
  }
  auto arch = ParseArchitecture((*archs)[0].get<std::string>());
  if (!arch.ok()) return r.Error("architectures", arch.status().message());
  return *arch;
}

// Keys whose presence asks for something the forward pass does not implement.
absl::Status RefuseUnsupportedFeatures(const ConfigReader& r) {
  ASSIGN_OR_RETURN(std::optional<std::string> act, r.OptString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return r.Error("hidden_act", absl::StrCat("unsupported activation '", *act, "' (only silu)"));
  }
  if (r.Get("quantization_config") != nullptr) {
    return r.Error("quantization_config", "quantized models are not supported");
  }
  if (r.Get("auto_map") != nullptr) {
    return r.Error("auto_map", "models with their own modeling code are not supported");
  }
  ASSIGN_OR_RETURN(std::optional<bool> enc_dec, r.OptBool("is_encoder_decoder"));
  if (enc_dec.value_or(false)) {
    return r.Error("is_encoder_decoder", "encoder-decoder models are not supported");
  }
  return absl::OkStatus();
}

// Sizes and heads, with each architecture's defaults as in transformers' config classes: an
// absent num_key_value_heads is num_attention_heads for Llama, 8 for Mistral and 32 for
// Qwen2/Qwen3; an absent head_dim is hidden_size / num_attention_heads, but 128 for Qwen3.
absl::Status ReadShape(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->hidden_size, r.PositiveInt("hidden_size"));
  ASSIGN_OR_RETURN(c->intermediate_size, r.PositiveInt("intermediate_size"));
  ASSIGN_OR_RETURN(c->num_hidden_layers, r.PositiveInt("num_hidden_layers"));
  ASSIGN_OR_RETURN(c->num_attention_heads, r.PositiveInt("num_attention_heads"));
  int64_t default_kv_heads = c->num_attention_heads;
  if (c->architecture == Architecture::kMistral) default_kv_heads = 8;
  if (IsQwen(c->architecture)) default_kv_heads = 32;
  ASSIGN_OR_RETURN(c->num_key_value_heads, r.PositiveInt("num_key_value_heads", default_kv_heads));
  if (c->num_attention_heads % c->num_key_value_heads != 0) {
    return r.Error("num_key_value_heads",
                   absl::StrCat(c->num_key_value_heads, " does not divide num_attention_heads ",
                                c->num_attention_heads));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, r.OptInt("head_dim"));
  if (!head_dim.has_value() && c->architecture == Architecture::kQwen3) head_dim = 128;
  if (head_dim.has_value()) {
    if (*head_dim <= 0 || *head_dim > 65536) return r.Error("head_dim", "must be in [1, 65536]");
    c->head_dim = *head_dim;
  } else {
    if (c->hidden_size % c->num_attention_heads != 0) {
      return r.Error(
          "num_attention_heads",
          absl::StrCat("does not divide hidden_size ", c->hidden_size, " and no head_dim is given"));
    }
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  if (c->head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  ASSIGN_OR_RETURN(c->vocab_size, r.PositiveInt("vocab_size"));
  // Defaults as in the transformers config classes; 2^30 positions is far past any model, and
  // prompt + max_tokens sums are computed in int64.
  int64_t default_max_pos = 2048;
  if (c->architecture == Architecture::kMistral) default_max_pos = 4096 * 32;
  if (IsQwen(c->architecture)) default_max_pos = 32768;
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.PositiveInt("max_position_embeddings", default_max_pos, kMaxContextTokens));
  return absl::OkStatus();
}

// Which biases the modeling code creates (transformers 5): Llama's attention_bias covers
// q/k/v/o and mlp_bias gate/up/down; Qwen3's attention_bias covers q/k/v/o; Qwen2 always has
// q/k/v biases and nothing else; Mistral has none. The keys an architecture ignores are read
// (so a bad type is still an error) and change nothing.
absl::Status ReadBiases(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::optional<bool> attention, r.OptBool("attention_bias"));
  ASSIGN_OR_RETURN(std::optional<bool> mlp, r.OptBool("mlp_bias"));
  switch (c->architecture) {
    case Architecture::kLlama:
      c->attention_bias = c->o_proj_bias = attention.value_or(false);
      c->mlp_bias = mlp.value_or(false);
      break;
    case Architecture::kQwen3:
      c->attention_bias = c->o_proj_bias = attention.value_or(false);
      break;
    case Architecture::kQwen2:
      c->attention_bias = true;
      break;
    case Architecture::kMistral:
      break;
  }
  return absl::OkStatus();
}

// `layer_types` as given, or as Qwen2/Qwen3's config derives it: layers from max_window_layers
// on are sliding when a window is enabled. Entries must be full_attention or sliding_attention.
absl::StatusOr<std::vector<std::string>> LayerTypes(const ConfigReader& r, const ModelConfig& c,
                                                    bool window_enabled) {
  std::vector<std::string> types;
  if (const Json* given = r.Get("layer_types")) {
    if (!given->is_array() || static_cast<int64_t>(given->size()) != c.num_hidden_layers) {
      return r.Error("layer_types", "must be a list of num_hidden_layers names");
    }
    for (const Json& t : *given) {
      if (!t.is_string() || (t != "full_attention" && t != "sliding_attention")) {
        return r.Error("layer_types", absl::StrCat(t.dump(), " is not supported (full_attention "
                                                             "or sliding_attention)"));
      }
      types.push_back(t.get<std::string>());
    }
    return types;
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> max_window_layers, r.OptInt("max_window_layers"));
  if (max_window_layers.value_or(0) < 0) return r.Error("max_window_layers", "must be >= 0");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool sliding =
        window_enabled && IsQwen(c.architecture) && i >= max_window_layers.value_or(28);
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  }
  return types;
}

// Sliding-window attention as transformers 5 applies it: Mistral on every layer (window 4096
// when the key is absent, none when null); Qwen2/Qwen3 on the layers `layer_types` marks (by
// default those from max_window_layers on), only with use_sliding_window. Llama's modeling code
// reads no window; one given anyway is treated as Mistral's, which refuses rather than guesses.
// A window at least as long as the context (a query at position p sees keys after p - window)
// is plain causal attention; a shorter one is refused until windowed attention exists.
absl::Status CheckSlidingWindow(const ConfigReader& r, const ModelConfig& c) {
  const bool qwen = IsQwen(c.architecture);
  ASSIGN_OR_RETURN(std::optional<bool> use_sw, r.OptBool("use_sliding_window"));
  // A plain value and flag, not the optional: gcc 12 cannot see through an optional inlined into
  // StrCat and warns (-Wmaybe-uninitialized) about a value read only when set.
  ASSIGN_OR_RETURN(const std::optional<int64_t> given, r.OptInt("sliding_window"));
  bool windowed = given.has_value();
  int64_t window = given.value_or(0);
  if (windowed && window <= 0) return r.Error("sliding_window", "must be positive");
  if (c.architecture == Architecture::kMistral && !r.Contains("sliding_window")) {
    windowed = true;
    window = 4096;  // MistralConfig's default; an explicit null disables it
  }
  if (qwen && !use_sw.value_or(false)) windowed = false;
  ASSIGN_OR_RETURN(std::vector<std::string> types, LayerTypes(r, c, windowed));
  for (size_t i = 0; i < types.size(); ++i) {
    const bool sliding = !qwen || types[i] == "sliding_attention";
    if (sliding && windowed && window < c.max_position_embeddings) {
      return r.Error("sliding_window",
                     absl::StrCat("sliding-window attention (window ", window, " < "
                                  "max_position_embeddings ", c.max_position_embeddings,
                                  ", layer ", i, ") is not supported"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseDtypeName(const ConfigReader& r, const char* key,
                                     const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  return r.Error(key, absl::StrCat("unsupported dtype '", name, "' (float32, float16 or bfloat16)"));
}

// transformers 5 writes `dtype`, older versions `torch_dtype`; both present must agree.
absl::Status ReadDtype(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.OptString("dtype"));
  ASSIGN_OR_RETURN(std::optional<std::string> torch_dtype, r.OptString("torch_dtype"));
  if (dtype.has_value() && torch_dtype.has_value() && *dtype != *torch_dtype) {
    return r.Error("dtype", absl::StrCat("\"", *dtype, "\" disagrees with torch_dtype = \"",
                                         *torch_dtype, "\""));
  }
  if (dtype.has_value()) {
    ASSIGN_OR_RETURN(c->torch_dtype, ParseDtypeName(r, "dtype", *dtype));
  } else if (torch_dtype.has_value()) {
    ASSIGN_OR_RETURN(c->torch_dtype, ParseDtypeName(r, "torch_dtype", *torch_dtype));
  }
  return absl::OkStatus();
}

absl::Status ReadSpecialTokens(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->bos_token_id, r.OptTokenId("bos_token_id"));
  ASSIGN_OR_RETURN(c->eos_token_ids, r.IntOrList("eos_token_id"));
  for (int64_t id : c->eos_token_ids) {
    if (id >= c->vocab_size) return r.Error("eos_token_id", "id outside the vocabulary");
  }
  if (c->bos_token_id.has_value() && *c->bos_token_id >= c->vocab_size) {
    return r.Error("bos_token_id", "id outside the vocabulary");
  }
  return absl::OkStatus();
}

// config.json and generation_config.json are a few KiB; the limit only refuses what is not one.
constexpr int64_t kMaxModelJsonBytes = 16 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadBoundedFile(path, kMaxModelJsonBytes, "model file");
}

}  // namespace

std::string ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "?";
}

absl::StatusOr<Architecture> ParseArchitecture(const std::string& name) {
  for (Architecture a :
       {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    if (name == ArchitectureName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported architecture '", name,
      "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"));
}


absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  ASSIGN_OR_RETURN(Json root, ParseObject(json_text, source));
  ConfigReader r(root, source);
  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, ReadArchitecture(r));
  RETURN_IF_ERROR(RefuseUnsupportedFeatures(r));
  RETURN_IF_ERROR(ReadShape(r, &c));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveNumber("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(model_internal::RopeSettings rope,
                   model_internal::ParseRopeSettings(root, r, c.max_position_embeddings));
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  RETURN_IF_ERROR(CheckSlidingWindow(r, c));
  ASSIGN_OR_RETURN(std::optional<bool> tie, r.OptBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  RETURN_IF_ERROR(ReadBiases(r, &c));
  c.qk_norm = c.architecture == Architecture::kQwen3;
  RETURN_IF_ERROR(ReadDtype(r, &c));
  RETURN_IF_ERROR(ReadSpecialTokens(r, &c));
  c.unrecognized_keys = UnrecognizedConfigKeys(root);
  return c;
}

float ModelConfig::softmax_scale() const {
  const double factor = rope_scaling.attention_factor;
  return static_cast<float>(factor * factor / std::sqrt(static_cast<double>(head_dim)));
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(text, path));
  if (!c.unrecognized_keys.empty()) {
    Log(LogLevel::kWarning, "model_config_unrecognized_keys",
        {{"file", path},
         {"keys", absl::StrJoin(c.unrecognized_keys, ",")},
         {"meaning", "not read by specula; assumed not to change the computation"}});
  }
  return c;
}

absl::StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                       const std::string& source) {
  ASSIGN_OR_RETURN(Json root, ParseObject(json_text, source));
  ConfigReader r(root, source);
  GenerationConfig g;
  ASSIGN_OR_RETURN(g.eos_token_ids, r.IntOrList("eos_token_id"));
  ASSIGN_OR_RETURN(g.bos_token_id, r.OptTokenId("bos_token_id"));
  ASSIGN_OR_RETURN(g.pad_token_id, r.OptTokenId("pad_token_id"));
  ASSIGN_OR_RETURN(g.do_sample, r.OptBool("do_sample"));
  ASSIGN_OR_RETURN(g.temperature, r.OptNumber("temperature"));
  if (g.temperature.has_value() && *g.temperature < 0) {
    return r.Error("temperature", "must be non-negative");
  }
  ASSIGN_OR_RETURN(g.top_p, r.OptNumber("top_p"));
  if (g.top_p.has_value() && !(*g.top_p > 0 && *g.top_p <= 1)) {
    return r.Error("top_p", "must be in (0, 1]");
  }
  ASSIGN_OR_RETURN(g.top_k, r.OptInt("top_k"));
  if (g.top_k.has_value() && *g.top_k < 0) return r.Error("top_k", "must be non-negative");
  ASSIGN_OR_RETURN(g.min_p, r.OptNumber("min_p"));
  if (g.min_p.has_value() && !(*g.min_p >= 0 && *g.min_p <= 1)) {
    return r.Error("min_p", "must be in [0, 1]");
  }
  ASSIGN_OR_RETURN(g.repetition_penalty, r.OptNumber("repetition_penalty"));
  if (g.repetition_penalty.has_value() && !(*g.repetition_penalty > 0)) {
    return r.Error("repetition_penalty", "must be positive");
  }
  ASSIGN_OR_RETURN(g.max_new_tokens, r.OptInt("max_new_tokens"));
  if (g.max_new_tokens.has_value() && *g.max_new_tokens < 0) {
    return r.Error("max_new_tokens", "must be non-negative");
  }
  return g;
}

absl::StatusOr<GenerationConfig> LoadGenerationConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationConfig{};
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseGenerationConfig(text, path);
}

}  // namespace specula
