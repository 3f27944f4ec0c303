#include "engine/model/tiny/tiny_model_writer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "engine/model/tiny/tiny_bpe_vocab.h"
#include "engine/model/tiny/tiny_tokenizer_files.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

constexpr int64_t kTokenizerVocab = 512;

// splitmix64 + Marsaglia's polar method: fixed arithmetic, so the weights do not depend on the
// standard library's distribution implementations (and no sin/cos, which keeps 100M draws fast).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, r2;
    do {
      u = static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0;  // [-1, 1)
      v = static_cast<double>(Next() >> 11) * 0x1.0p-52 - 1.0;
      r2 = u * u + v * v;
    } while (r2 >= 1.0 || r2 == 0.0);
    const double f = std::sqrt(-2.0 * std::log(r2) / r2);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Each tensor draws from its own stream keyed by its name, so changing the layer count or the
// order of tensors leaves every other tensor's values unchanged.
uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return Rng(seed ^ h).Next();
}

struct Shape {
  int64_t vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, max_pos;
};

enum class Init { kNormal, kNorm, kBias };

TensorToWrite MakeTensor(const std::string& name, std::vector<int64_t> shape, Init init,
                         double scale, DType dtype, uint64_t seed) {
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  Rng rng(TensorSeed(seed, name));
  auto* out = reinterpret_cast<unsigned char*>(t.data.data());
  for (int64_t i = 0; i < n; ++i) {
    const double z = rng.Normal();
    const float v = static_cast<float>(init == Init::kNorm ? 1.0 + scale * z : scale * z);
    uint32_t bits;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&bits, &v, 4);
        for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<unsigned char>(bits >> (8 * b));
        break;
      case DType::kF16:
      case DType::kBF16: {
        const uint16_t h = dtype == DType::kF16 ? FloatToF16(v) : FloatToBf16(v);
        out[2 * i] = static_cast<unsigned char>(h);
        out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
        break;
      }
    }
  }
  return t;
}

bool Tied(TinyArch a) { return a != TinyArch::kLlama && a != TinyArch::kMistral; }
bool IsLlama(TinyArch a) { return a == TinyArch::kLlama || a == TinyArch::kLlama3; }

// Scales chosen so activations stay O(1) through the layers and the logits have a standard
// deviation of about 4: greedy decoding is then decided by clear margins, not rounding noise.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  double scale;
};

// Tensors draw from independent streams, so filling them in parallel changes no byte.
std::vector<TensorToWrite> Generate(const std::vector<TensorSpec>& specs, DType dtype,
                                    uint64_t seed) {
  std::vector<TensorToWrite> out(specs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) {
      out[i] =
          MakeTensor(specs[i].name, specs[i].shape, specs[i].init, specs[i].scale, dtype, seed);
    }
  };
  const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return out;
}

std::vector<TensorToWrite> MakeWeights(const TinyModelOptions& o, const Shape& s) {
  std::vector<TensorSpec> w;
  const int64_t q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
  const double logit_std = 4.0;
  const double embed_std = Tied(o.arch) ? logit_std / std::sqrt(double(s.hidden)) : 1.0;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    w.push_back({name, {out, in}, Init::kNormal, 1.0 / std::sqrt(double(in))});
  };
  auto vec = [&](const std::string& name, int64_t n, Init init, double scale) {
    w.push_back({name, {n}, init, scale});
  };
  w.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}, Init::kNormal, embed_std});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    vec(p + "input_layernorm.weight", s.hidden, Init::kNorm, 0.1);
    linear(p + "self_attn.q_proj.weight", q_dim, s.hidden);
    linear(p + "self_attn.k_proj.weight", kv_dim, s.hidden);
    linear(p + "self_attn.v_proj.weight", kv_dim, s.hidden);
    if (o.arch == TinyArch::kQwen2 || o.biases) {
      // Large enough that dropping a bias changes the logits visibly.
      vec(p + "self_attn.q_proj.bias", q_dim, Init::kBias, 0.5);
      vec(p + "self_attn.k_proj.bias", kv_dim, Init::kBias, 0.5);
      vec(p + "self_attn.v_proj.bias", kv_dim, Init::kBias, 0.5);
    }
    linear(p + "self_attn.o_proj.weight", s.hidden, q_dim);
    if (o.biases) vec(p + "self_attn.o_proj.bias", s.hidden, Init::kBias, 0.5);
    if (o.arch == TinyArch::kQwen3) {
      vec(p + "self_attn.q_norm.weight", s.head_dim, Init::kNorm, 0.1);
      vec(p + "self_attn.k_norm.weight", s.head_dim, Init::kNorm, 0.1);
    }
    vec(p + "post_attention_layernorm.weight", s.hidden, Init::kNorm, 0.1);
    linear(p + "mlp.gate_proj.weight", s.intermediate, s.hidden);
    linear(p + "mlp.up_proj.weight", s.intermediate, s.hidden);
    linear(p + "mlp.down_proj.weight", s.hidden, s.intermediate);
    if (o.biases && IsLlama(o.arch)) {
      vec(p + "mlp.gate_proj.bias", s.intermediate, Init::kBias, 0.5);
      vec(p + "mlp.up_proj.bias", s.intermediate, Init::kBias, 0.5);
      vec(p + "mlp.down_proj.bias", s.hidden, Init::kBias, 0.5);
    }
  }
  vec("model.norm.weight", s.hidden, Init::kNorm, 0.1);
  if (!Tied(o.arch)) {
    w.push_back({"lm_head.weight",
                 {s.vocab, s.hidden},
                 Init::kNormal,
                 logit_std / std::sqrt(double(s.hidden))});
  }
  return Generate(w, o.dtype, o.seed);
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  return WriteTextFile(path.string(), text);
}

absl::Status WriteWeights(const TinyModelOptions& o, std::vector<TensorToWrite> tensors) {
  const fs::path dir(o.out_dir);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (o.shards == 1) return WriteSafetensors((dir / "model.safetensors").string(), tensors, meta);
  const size_t n = static_cast<size_t>(o.shards);
  if (n > tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards ", n, " exceeds the number of tensors ", tensors.size()));
  }
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.data.size();
  // Contiguous groups of roughly equal bytes, none empty.
  nlohmann::json weight_map = nlohmann::json::object();
  size_t next = 0;
  uint64_t cum = 0;
  for (size_t s = 0; s < n; ++s) {
    std::vector<TensorToWrite> group;
    while (next < tensors.size() - (n - 1 - s)) {
      if (!group.empty() && s + 1 < n && cum >= total * (s + 1) / n) break;
      cum += tensors[next].data.size();
      group.push_back(std::move(tensors[next++]));
    }
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, n);
    for (const auto& t : group) weight_map[t.name] = file;
    RETURN_IF_ERROR(WriteSafetensors((dir / file).string(), group, meta));
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

OJson RopeScalingJson(const TinyModelOptions& o) {
  // Short original contexts make the scaling touch every frequency band of the tiny model.
  const int64_t original_context = o.preset == "tiny" ? 64 : 1024;
  if (o.rope == "yarn") {
    return {{"factor", 4.0},
            {"original_max_position_embeddings", original_context},
            {"rope_type", "yarn"}};
  }
  if (o.arch == TinyArch::kLlama3) {
    return {{"factor", 8.0},
            {"high_freq_factor", 4.0},
            {"low_freq_factor", 1.0},
            {"original_max_position_embeddings", original_context},
            {"rope_type", "llama3"}};
  }
  return nullptr;
}

// What transformers 5's save_pretrained writes for the same model: rope_theta and rope_scaling
// folded into rope_parameters, `dtype` for `torch_dtype`.
OJson ToTransformers5Form(OJson c) {
  OJson out;
  for (auto& [key, value] : c.items()) {
    if (key == "rope_theta" || key == "rope_scaling") continue;
    if (key == "torch_dtype") {
      out["dtype"] = value;
      continue;
    }
    out[key] = value;
  }
  OJson rope = {{"rope_theta", c["rope_theta"]}, {"rope_type", "default"}};
  if (!c["rope_scaling"].is_null()) {
    for (auto& [key, value] : c["rope_scaling"].items()) rope[key] = value;
  }
  out["rope_parameters"] = rope;
  out["transformers_version"] = "5.0.0";
  return out;
}

OJson ModelConfigJson(const TinyModelOptions& o, const Shape& s, const TinyBpeVocab& vocab) {
  static constexpr const char* kDtypeNames[] = {"float32", "float16", "bfloat16"};
  const bool qwen = o.arch == TinyArch::kQwen2 || o.arch == TinyArch::kQwen3;
  static constexpr const char* kModelTypes[] = {"llama", "llama", "mistral", "qwen2", "qwen3"};
  OJson c;
  c["architectures"] = {ArchitectureName(o.arch == TinyArch::kMistral ? Architecture::kMistral
                                         : o.arch == TinyArch::kQwen2 ? Architecture::kQwen2
                                         : o.arch == TinyArch::kQwen3 ? Architecture::kQwen3
                                                                      : Architecture::kLlama)};
  c["model_type"] = kModelTypes[static_cast<int>(o.arch)];
  c["attention_dropout"] = 0.0;
  if (o.arch != TinyArch::kQwen2) c["attention_bias"] = o.biases;
  if (IsLlama(o.arch)) c["mlp_bias"] = o.biases;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden;
  c["intermediate_size"] = s.intermediate;
  c["num_hidden_layers"] = s.layers;
  c["num_attention_heads"] = s.heads;
  c["num_key_value_heads"] = s.kv_heads;
  // Llama 2 / Mistral configs leave head_dim implicit; Llama 3.2 and Qwen3 spell it out.
  if (o.arch == TinyArch::kLlama3 || o.arch == TinyArch::kQwen3 ||
      s.hidden != s.heads * s.head_dim) {
    c["head_dim"] = s.head_dim;
  }
  c["max_position_embeddings"] = s.max_pos;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = qwen ? 1e-6 : 1e-5;
  c["rope_theta"] = o.arch == TinyArch::kLlama    ? 10000.0
                    : o.arch == TinyArch::kLlama3 ? 500000.0
                                                  : 1000000.0;
  c["rope_scaling"] = RopeScalingJson(o);
  if (o.arch == TinyArch::kMistral) c["sliding_window"] = nullptr;
  if (qwen) {
    c["use_sliding_window"] = false;
    if (o.arch == TinyArch::kQwen2) {
      c["sliding_window"] = s.max_pos;
      c["max_window_layers"] = s.layers;
    } else {
      c["sliding_window"] = nullptr;
    }
  }
  c["tie_word_embeddings"] = Tied(o.arch);
  c["torch_dtype"] = kDtypeNames[static_cast<int>(o.dtype)];
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab;
  const TinySpecialIds ids = SpecialIdsFor(o.arch, vocab);
  c["bos_token_id"] = ids.bos;
  // Qwen2 ships a single eos id in config.json and the full list in generation_config.json.
  if (o.arch == TinyArch::kQwen2) {
    c["eos_token_id"] = ids.eos.front();
  } else {
    c["eos_token_id"] = ids.eos;
  }
  c["transformers_version"] = "4.51.0";
  return o.config_form == "v5" ? ToTransformers5Form(std::move(c)) : c;
}

OJson GenerationConfigJson(const TinyModelOptions& o, const TinyBpeVocab& vocab) {
  const TinySpecialIds ids = SpecialIdsFor(o.arch, vocab);
  OJson g;
  g["bos_token_id"] = ids.bos;
  g["eos_token_id"] = ids.eos;
  if (ids.pad >= 0) g["pad_token_id"] = ids.pad;
  g["do_sample"] = true;
  g["temperature"] = 0.6;
  g["top_p"] = 0.9;
  g["transformers_version"] = "4.51.0";
  return g;
}

absl::StatusOr<Shape> ResolveShape(const TinyModelOptions& o) {
  Shape s;
  if (o.preset == "tiny") {
    s = {kTokenizerVocab, 64, 2, 4, 2, o.arch == TinyArch::kQwen3 ? 32 : 16, 160, 4096};
  } else if (o.preset == "100m") {
    s = {32000, 768, 12, 12, 4, o.arch == TinyArch::kQwen3 ? 128 : 64, 2048, 8192};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown preset '", o.preset, "' (tiny|100m)"));
  }
  for (auto [override_value, field] : {std::pair{o.vocab, &s.vocab},
                                       {o.hidden, &s.hidden},
                                       {o.layers, &s.layers},
                                       {o.heads, &s.heads},
                                       {o.kv_heads, &s.kv_heads},
                                       {o.head_dim, &s.head_dim},
                                       {o.intermediate, &s.intermediate},
                                       {o.max_position_embeddings, &s.max_pos}}) {
    if (override_value < 0) return absl::InvalidArgumentError("overrides must be positive");
    if (override_value > 0) *field = override_value;
  }
  // A head_dim override alone keeps heads; a hidden/heads override without head_dim follows it
  // for the architectures whose head_dim is implicit.
  if (o.head_dim == 0 && o.arch != TinyArch::kQwen3 && (o.hidden > 0 || o.heads > 0)) {
    if (s.hidden % s.heads != 0) return absl::InvalidArgumentError("heads must divide hidden");
    s.head_dim = s.hidden / s.heads;
  }
  if (s.heads % s.kv_heads != 0) return absl::InvalidArgumentError("kv_heads must divide heads");
  if (s.head_dim % 2 != 0) return absl::InvalidArgumentError("head_dim must be even (RoPE)");
  if (s.vocab < kTokenizerVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab ", s.vocab, " is smaller than the tokenizer's ", kTokenizerVocab));
  }
  if (o.shards < 1) return absl::InvalidArgumentError("--shards must be >= 1");
  if (o.biases && o.arch != TinyArch::kQwen3 && !IsLlama(o.arch)) {
    return absl::InvalidArgumentError("--biases: only llama, llama3 and qwen3 have bias switches");
  }
  if (!o.rope.empty() && o.rope != "yarn") {
    return absl::InvalidArgumentError(absl::StrCat("unknown --rope '", o.rope, "' (yarn)"));
  }
  if (o.config_form != "v4" && o.config_form != "v5") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --config_form '", o.config_form, "' (v4|v5)"));
  }
  return s;
}

}  // namespace

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorToWrite>> MakeTinyWeights(const TinyModelOptions& options) {
  ASSIGN_OR_RETURN(const Shape shape, ResolveShape(options));
  return MakeWeights(options, shape);
}

absl::StatusOr<TinyArch> ParseTinyArch(const std::string& name) {
  for (TinyArch a : {TinyArch::kLlama, TinyArch::kLlama3, TinyArch::kMistral, TinyArch::kQwen2,
                     TinyArch::kQwen3}) {
    if (name == TinyArchName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --arch '", name, "' (llama|llama3|mistral|qwen2|qwen3)"));
}

std::string TinyArchName(TinyArch arch) {
  static constexpr const char* kNames[] = {"llama", "llama3", "mistral", "qwen2", "qwen3"};
  return kNames[static_cast<int>(arch)];
}

absl::Status WriteTinyModel(const TinyModelOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  ASSIGN_OR_RETURN(const Shape shape, ResolveShape(options));
  ASSIGN_OR_RETURN(const TinyBpeVocab vocab,
                   BuildTinyBpeVocab(SpecialTokensFor(options.arch), kTokenizerVocab));
  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": ", ec.message()));
  // Stale weights from a run with another --shards would otherwise shadow or confuse the index.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (name.rfind("model-", 0) == 0 && name.size() > 12 &&
         name.substr(name.size() - 12) == ".safetensors")) {
      fs::remove(entry.path(), ec);
    }
  }

  const OJson config = ModelConfigJson(options, shape, vocab);
  // The writer's own output must load; catching a mismatch here beats a confusing test failure.
  RETURN_IF_ERROR(ParseModelConfig(config.dump(), "generated config.json").status());
  RETURN_IF_ERROR(WriteText(dir / "config.json", config.dump(2) + "\n"));
  RETURN_IF_ERROR(WriteText(dir / "generation_config.json",
                            GenerationConfigJson(options, vocab).dump(2) + "\n"));
  RETURN_IF_ERROR(WriteText(dir / "tokenizer.json", TokenizerJson(options.arch, vocab) + "\n"));
  RETURN_IF_ERROR(
      WriteText(dir / "tokenizer_config.json", TokenizerConfigJson(options.arch, vocab) + "\n"));
  return WriteWeights(options, MakeWeights(options, shape));
}

}  // namespace specula
