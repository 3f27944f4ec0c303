#include "engine/model/tiny/scripted_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

// The logit of the scripted successor: large against the other chain rows' (random cosines of
// 64-dimensional directions, |cos| < 0.4) and the rest's (0).
constexpr float kChainLogitScale = 2.0f;

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot read"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  return WriteTextFile(path.string(), text);
}

float GetValue(const TensorToWrite& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data.data() + 2 * i, 2);
  return t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

void SetValue(TensorToWrite& t, int64_t i, float v) {
  if (t.dtype == DType::kF32) {
    std::memcpy(t.data.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t.dtype == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v);
  std::memcpy(t.data.data() + 2 * i, &h, 2);
}

void Fill(TensorToWrite& t, float v) {
  const int64_t n = static_cast<int64_t>(t.data.size() / DTypeSize(t.dtype));
  for (int64_t i = 0; i < n; ++i) SetValue(t, i, v);
}

// The chain's token ids: the script's tokens, then end-of-sequence; each id once.
absl::StatusOr<std::vector<int32_t>> ChainIds(const Tokenizer& tokenizer,
                                              const std::string& script) {
  EncodeOptions options;
  options.add_special_tokens = false;
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(script, options));
  const std::optional<TokenId> eos = tokenizer.eos_token_id();
  if (!eos.has_value()) return absl::InvalidArgumentError("the tokenizer names no eos_token");
  ids.push_back(*eos);
  if (ids.size() < 2) return absl::InvalidArgumentError("the script needs at least one token");
  absl::flat_hash_map<int32_t, size_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (auto [it, fresh] = seen.emplace(ids[i], i); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the script's token ", ids[i], " ('", tokenizer.IdToToken(ids[i]), "') appears at ",
          it->second, " and ", i, ": a bigram chain can give it only one successor"));
    }
  }
  return ids;
}

// Zero attention and MLP outputs, unit norms, and an lm_head holding the chain.
void ScriptWeights(std::vector<TensorToWrite>& tensors, const std::vector<int32_t>& chain) {
  const TensorToWrite* embed = nullptr;
  TensorToWrite* lm_head = nullptr;
  for (TensorToWrite& t : tensors) {
    if (absl::EndsWith(t.name, "o_proj.weight") || absl::EndsWith(t.name, "down_proj.weight")) {
      Fill(t, 0.0f);
    } else if (absl::EndsWith(t.name, "norm.weight")) {
      Fill(t, 1.0f);
    } else if (t.name == "lm_head.weight") {
      Fill(t, 0.0f);
      lm_head = &t;
    } else if (t.name == "model.embed_tokens.weight") {
      embed = &t;
    }
  }
  const int64_t hidden = embed->shape[1];
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    const int64_t from = chain[i], to = chain[i + 1];
    double norm2 = 0;
    for (int64_t d = 0; d < hidden; ++d) norm2 += std::pow(GetValue(*embed, from * hidden + d), 2);
    const float inv = kChainLogitScale / static_cast<float>(std::sqrt(norm2));
    for (int64_t d = 0; d < hidden; ++d) {
      SetValue(*lm_head, to * hidden + d, GetValue(*embed, from * hidden + d) * inv);
    }
  }
}

// config.json and generation_config.json with the real tokenizer's vocabulary and special ids.
absl::Status PatchConfigs(const fs::path& dir, const Tokenizer& tokenizer) {
  for (const char* name : {"config.json", "generation_config.json"}) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(dir / name));
    OJson c = OJson::parse(text);
    if (std::string(name) == "config.json") c["vocab_size"] = tokenizer.vocab_size();
    const std::optional<TokenId> bos = tokenizer.bos_token_id();
    c["bos_token_id"] = bos.has_value() ? OJson(*bos) : OJson();
    c["eos_token_id"] = *tokenizer.eos_token_id();
    c.erase("pad_token_id");
    RETURN_IF_ERROR(WriteText(dir / name, c.dump(2) + "\n"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteScriptedModel(const ScriptedModelOptions& o) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromDirectory(o.tokenizer_dir));
  ASSIGN_OR_RETURN(const std::vector<int32_t> chain, ChainIds(*tokenizer, o.script));
  TinyModelOptions tiny;
  tiny.out_dir = o.out_dir;
  tiny.arch = TinyArch::kLlama;  // untied: lm_head is free to hold the chain
  tiny.dtype = o.dtype;
  tiny.seed = o.seed;
  tiny.vocab = tokenizer->vocab_size();
  RETURN_IF_ERROR(WriteTinyModel(tiny));
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors, MakeTinyWeights(tiny));
  ScriptWeights(tensors, chain);
  const fs::path dir(o.out_dir);
  RETURN_IF_ERROR(WriteSafetensors((dir / "model.safetensors").string(), tensors,
                                   {{"format", "pt"}}));
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(fs::path(o.tokenizer_dir) / name));
    RETURN_IF_ERROR(WriteText(dir / name, text));
  }
  return PatchConfigs(dir, *tokenizer);
}

}  // namespace specula
