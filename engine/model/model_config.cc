#include "engine/model/model_config.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

using Json = nlohmann::json;

// Reads keys of one JSON object, producing errors that name the file and the key. Null counts
// as absent throughout: HF configs write `"head_dim": null`, `"rope_scaling": null`, etc.
class ConfigReader {
 public:
  ConfigReader(const Json& obj, const std::string& source) : obj_(obj), source_(source) {}

  absl::Status Error(absl::string_view key, absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", key, ": ", msg));
  }

  const Json* Get(const std::string& key) const {
    auto it = obj_.find(key);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }

  absl::StatusOr<std::optional<int64_t>> OptInt(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX)) {
      return Error(key, "must be an integer");
    }
    return std::optional<int64_t>(v->get<int64_t>());
  }

  // A size in [1, max]; `fallback` when absent, required when no fallback. Sizes are int32 in
  // kernels and the API, so the default bound is INT32_MAX: a larger value is refused, never cut.
  absl::StatusOr<int64_t> PositiveInt(const std::string& key,
                                      std::optional<int64_t> fallback = std::nullopt,
                                      int64_t max = std::numeric_limits<int32_t>::max()) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(key));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "required key is missing");
    }
    if (*v <= 0) return Error(key, absl::StrCat("must be positive, got ", *v));
    if (*v > max) return Error(key, absl::StrCat("must be at most ", max, ", got ", *v));
    return *v;
  }

  absl::StatusOr<std::optional<double>> OptNumber(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return Error(key, "must be a number");
    return std::optional<double>(v->get<double>());
  }

  absl::StatusOr<double> PositiveNumber(const std::string& key,
                                        std::optional<double> fallback) const {
    ASSIGN_OR_RETURN(std::optional<double> v, OptNumber(key));
    if (!v.has_value()) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "required key is missing");
    }
    if (!(*v > 0)) return Error(key, absl::StrCat("must be positive, got ", *v));
    return *v;
  }

  absl::StatusOr<std::optional<bool>> OptBool(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_boolean()) return Error(key, "must be true or false");
    return std::optional<bool>(v->get<bool>());
  }

  absl::StatusOr<std::optional<std::string>> OptString(const std::string& key) const {
    const Json* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) return Error(key, "must be a string");
    return std::optional<std::string>(v->get<std::string>());
  }

  // `eos_token_id`: an int or a list of ints.
  absl::StatusOr<std::vector<int64_t>> IntOrList(const std::string& key) const {
    std::vector<int64_t> out;
    const Json* v = Get(key);
    if (v == nullptr) return out;
    if (v->is_array()) {
      for (const Json& e : *v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0) {
          return Error(key, "must be a non-negative integer or a list of them");
        }
        out.push_back(e.get<int64_t>());
      }
      return out;
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> one, OptInt(key));
    if (*one < 0) return Error(key, "must be non-negative");
    out.push_back(*one);
    return out;
  }

  absl::StatusOr<std::optional<int64_t>> OptTokenId(const std::string& key) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, OptInt(key));
    if (v.has_value() && *v < 0) return Error(key, "must be non-negative");
    return v;
  }

 private:
  const Json& obj_;
  const std::string& source_;
};

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

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& root, const ConfigReader& top) {
  RopeScaling rs;
  auto it = root.find("rope_scaling");
  if (it == root.end() || it->is_null()) return rs;
  if (!it->is_object()) return top.Error("rope_scaling", "must be an object or null");
  std::optional<std::string> type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = it->find(key);
    if (t != it->end() && !t->is_null()) {
      if (!t->is_string()) return top.Error("rope_scaling", absl::StrCat(key, " must be a string"));
      type = t->get<std::string>();
      break;
    }
  }
  if (!type.has_value()) return top.Error("rope_scaling", "missing rope_type");
  // Numbers inside rope_scaling are reported as "rope_scaling.<key>".
  auto number = [&](const char* key, std::optional<double> fallback) -> absl::StatusOr<double> {
    auto v = it->find(key);
    if (v == it->end() || v->is_null()) {
      if (fallback.has_value()) return *fallback;
      return top.Error(absl::StrCat("rope_scaling.", key), "required key is missing");
    }
    if (!v->is_number() || !(v->get<double>() > 0)) {
      return top.Error(absl::StrCat("rope_scaling.", key), "must be a positive number");
    }
    return v->get<double>();
  };
  if (*type == "default") return rs;
  if (*type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    ASSIGN_OR_RETURN(rs.factor, number("factor", std::nullopt));
    return rs;
  }
  if (*type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(rs.factor, number("factor", std::nullopt));
    ASSIGN_OR_RETURN(rs.low_freq_factor, number("low_freq_factor", std::nullopt));
    ASSIGN_OR_RETURN(rs.high_freq_factor, number("high_freq_factor", std::nullopt));
    auto orig = it->find("original_max_position_embeddings");
    if (orig == it->end() || !orig->is_number_integer() || orig->get<int64_t>() <= 0) {
      return top.Error("rope_scaling.original_max_position_embeddings",
                       "must be a positive integer");
    }
    rs.original_max_position_embeddings = orig->get<int64_t>();
    // The smoothing between the two bands divides by (high - low).
    if (!(rs.high_freq_factor > rs.low_freq_factor)) {
      return top.Error("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
    }
    return rs;
  }
  return top.Error("rope_scaling",
                   absl::StrCat("unsupported rope_type '", *type, "' (supported: linear, llama3)"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text;
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

  const Json* archs = r.Get("architectures");
  if (archs == nullptr) return r.Error("architectures", "required key is missing");
  if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
    return r.Error("architectures", "must be a list of exactly one name");
  }
  {
    auto arch = ParseArchitecture((*archs)[0].get<std::string>());
    if (!arch.ok()) return r.Error("architectures", arch.status().message());
    c.architecture = *arch;
  }

  // Keys the forward pass does not implement are refused rather than silently ignored.
  ASSIGN_OR_RETURN(std::optional<std::string> act, r.OptString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return r.Error("hidden_act", absl::StrCat("unsupported activation '", *act, "' (only silu)"));
  }
  if (r.Get("quantization_config") != nullptr) {
    return r.Error("quantization_config", "quantized models are not supported");
  }
  ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, r.OptBool("mlp_bias"));
  if (mlp_bias.value_or(false)) return r.Error("mlp_bias", "MLP biases are not supported");

  ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, r.PositiveInt("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_attention_heads, r.PositiveInt("num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   r.PositiveInt("num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Error("num_key_value_heads",
                   absl::StrCat(c.num_key_value_heads, " does not divide num_attention_heads ",
                                c.num_attention_heads));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, r.OptInt("head_dim"));
  if (head_dim.has_value()) {
    if (*head_dim <= 0 || *head_dim > 65536) return r.Error("head_dim", "must be in [1, 65536]");
    c.head_dim = *head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return r.Error(
          "num_attention_heads",
          absl::StrCat("does not divide hidden_size ", c.hidden_size, " and no head_dim is given"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt("vocab_size"));

  // Defaults as in the transformers config classes.
  int64_t default_max_pos = 2048;
  if (c.architecture == Architecture::kMistral) default_max_pos = 4096 * 32;
  if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen3) {
    default_max_pos = 32768;
  }
  // 2^30 positions: far past any model; prompt + max_tokens sums are computed in int64.
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   r.PositiveInt("max_position_embeddings", default_max_pos, kMaxContextTokens));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveNumber("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_theta, r.PositiveNumber("rope_theta", 10000.0));
  ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(root, r));

  // A window that is disabled (Qwen's use_sliding_window=false) or at least as long as the
  // context is plain full attention; anything else needs windowed attention we do not do.
  ASSIGN_OR_RETURN(std::optional<bool> use_sw, r.OptBool("use_sliding_window"));
  ASSIGN_OR_RETURN(std::optional<int64_t> sliding_window, r.OptInt("sliding_window"));
  const bool window_enabled = use_sw.value_or(c.architecture != Architecture::kQwen2 &&
                                              c.architecture != Architecture::kQwen3);
  if (window_enabled && sliding_window.has_value() && *sliding_window < c.max_position_embeddings) {
    return r.Error("sliding_window", absl::StrCat("sliding-window attention (window ",
                                                  *sliding_window, " < max_position_embeddings ",
                                                  c.max_position_embeddings, ") is not supported"));
  }

  ASSIGN_OR_RETURN(std::optional<bool> tie, r.OptBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  ASSIGN_OR_RETURN(std::optional<bool> bias, r.OptBool("attention_bias"));
  c.attention_bias = c.architecture == Architecture::kQwen2 || bias.value_or(false);
  c.qk_norm = c.architecture == Architecture::kQwen3;

  // Newer transformers write `dtype`, older `torch_dtype`.
  ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.OptString("torch_dtype"));
  const char* dtype_key = "torch_dtype";
  if (!dtype.has_value()) {
    ASSIGN_OR_RETURN(dtype, r.OptString("dtype"));
    dtype_key = "dtype";
  }
  if (dtype.has_value()) {
    if (*dtype == "float32") {
      c.torch_dtype = DType::kF32;
    } else if (*dtype == "float16") {
      c.torch_dtype = DType::kF16;
    } else if (*dtype == "bfloat16") {
      c.torch_dtype = DType::kBF16;
    } else {
      return r.Error(dtype_key, absl::StrCat("unsupported dtype '", *dtype,
                                             "' (float32, float16 or bfloat16)"));
    }
  }

  ASSIGN_OR_RETURN(c.bos_token_id, r.OptTokenId("bos_token_id"));
  ASSIGN_OR_RETURN(c.eos_token_ids, r.IntOrList("eos_token_id"));
  for (int64_t id : c.eos_token_ids) {
    if (id >= c.vocab_size) return r.Error("eos_token_id", "id outside the vocabulary");
  }
  if (c.bos_token_id.has_value() && *c.bos_token_id >= c.vocab_size) {
    return r.Error("bos_token_id", "id outside the vocabulary");
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseModelConfig(text, path);
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
