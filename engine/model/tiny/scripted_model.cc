#include "engine/model/tiny/scripted_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

// The hidden dimensions the switch uses when there is a second chain: one every token holds at
// kSwitchValue (the queries' constant), one only the switch token holds (the key and value), and
// the flag the head writes. The chains live in the others.
struct Dims {
  int64_t hidden = 0;
  int64_t tokens = 0;  // the chains' dimensions: [0, tokens)
  int64_t constant = -1, switch_marker = -1, flag = -1;
};
constexpr float kSwitchValue = 8.0f;
// The query and key weights (the switch token's score is ~26 against 0 for the rest, so its
// softmax weight stays ~1 while the slow RoPE pair has turned little: up to ~1,500 positions
// between the switch token and the answer; the tests' conversations are far shorter), the
// value-times-output weight (a flag of ~7, about a token embedding's norm), and the second chain's
// first logit: kAfterTrigger times the trigger's direction (under the first chain's
// kChainLogitScale) plus the flag.
constexpr float kQueryKey = 2.0f, kValue = 1.0f, kOutput = 0.376f, kAfterTrigger = 1.5f;

TensorToWrite* Find(std::vector<TensorToWrite>& tensors, const std::string& name) {
  for (TensorToWrite& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The direction of `token`'s embedding within the chains' dimensions.
std::vector<float> Direction(const TensorToWrite& embed, int64_t token, const Dims& d) {
  std::vector<float> v(static_cast<size_t>(d.tokens));
  double norm2 = 0;
  for (int64_t i = 0; i < d.tokens; ++i) {
    v[i] = GetValue(embed, token * d.hidden + i);
    norm2 += double(v[i]) * v[i];
  }
  for (float& x : v) x /= static_cast<float>(std::sqrt(norm2));
  return v;
}

// Adds `scale` times `direction` to lm_head's row of `token`.
void AddRow(TensorToWrite& lm_head, int64_t token, const std::vector<float>& direction, float scale,
            const Dims& d) {
  for (int64_t i = 0; i < d.tokens; ++i) {
    const int64_t at = token * d.hidden + i;
    SetValue(lm_head, at, GetValue(lm_head, at) + scale * direction[i]);
  }
}

// The first layer's head that finds `switch_id` in the context and writes the flag.
void SwitchHead(std::vector<TensorToWrite>& tensors, TensorToWrite& embed, int32_t switch_id,
                int64_t hd, const Dims& d) {
  const int64_t vocab = embed.shape[0];
  for (int64_t t = 0; t < vocab; ++t) {
    SetValue(embed, t * d.hidden + d.constant, kSwitchValue);
    SetValue(embed, t * d.hidden + d.switch_marker, t == switch_id ? kSwitchValue : 0.0f);
    SetValue(embed, t * d.hidden + d.flag, 0.0f);
  }
  const std::string p = "model.layers.0.self_attn.";
  TensorToWrite* q = Find(tensors, p + "q_proj.weight");
  TensorToWrite* k = Find(tensors, p + "k_proj.weight");
  TensorToWrite* v = Find(tensors, p + "v_proj.weight");
  TensorToWrite* o = Find(tensors, p + "o_proj.weight");
  for (TensorToWrite* t : {q, k, v, o}) Fill(*t, 0.0f);
  const int64_t q_dim = q->shape[0], kv_dim = k->shape[0];
  // Llama's RoPE pairs dimension i with i + head_dim/2; the pair of i = head_dim/2 - 1 turns
  // slowest (10^-3.5 rad per position at rope_theta 10^4 and head_dim 16).
  const int64_t slow = hd / 2 - 1;
  for (int64_t head = 0; head < q_dim / hd; ++head) {
    SetValue(*q, (head * hd + slow) * d.hidden + d.constant, kQueryKey);
    SetValue(*o, d.flag * q_dim + head * hd, kOutput);
  }
  for (int64_t group = 0; group < kv_dim / hd; ++group) {
    SetValue(*k, (group * hd + slow) * d.hidden + d.switch_marker, kQueryKey);
    SetValue(*v, (group * hd) * d.hidden + d.switch_marker, kValue);
  }
}
struct Chains;
absl::StatusOr<Chains> ChainsOf(const Tokenizer& tokenizer, const ScriptedModelOptions& o);

// The chains the model follows: `first` from the trigger, and `after` (empty, or from the same
// trigger) once the context holds the switch token.
struct Chains {
  std::vector<int32_t> first, after;
  int32_t switch_id = -1;
};

// The flag the switch head writes once the switch token is in the context: each query head puts
// its whole weight on it and passes on its value (the switch marker after the input norm).
float FlagValue(const TensorToWrite& embed, int32_t switch_id, int64_t head_dim,
                std::vector<TensorToWrite>& tensors, const Dims& d) {
  if (d.flag < 0) return 0.0f;
  double sum2 = 0;
  for (int64_t i = 0; i < d.hidden; ++i) {
    sum2 += std::pow(GetValue(embed, int64_t{switch_id} * d.hidden + i), 2);
  }
  const double rms = std::sqrt(sum2 / double(d.hidden));
  const int64_t heads =
      Find(tensors, "model.layers.0.self_attn.q_proj.weight")->shape[0] / head_dim;
  return static_cast<float>(double(heads) * kOutput * kValue * kSwitchValue / rms);
}

// Whether greedy decoding follows `chain` from each of its tokens, with `flag` in the residual
// stream: the successor's logit beats every other chain row's by a margin.
bool Follows(const TensorToWrite& embed, const TensorToWrite& lm_head,
             const std::vector<int32_t>& chain, const std::vector<int32_t>& rows, float flag,
             const Dims& d) {
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    auto logit = [&](int32_t row) {
      double sum = 0;
      for (int64_t k = 0; k < d.tokens; ++k) {
        sum += double(GetValue(lm_head, row * d.hidden + k)) *
               GetValue(embed, int64_t{chain[i]} * d.hidden + k);
      }
      if (d.flag >= 0) sum += double(GetValue(lm_head, row * d.hidden + d.flag)) * flag;
      return sum;
    };
    const double want = logit(chain[i + 1]);
    for (int32_t row : rows) {
      if (row != chain[i + 1] && logit(row) > want - 1.0) return false;
    }
  }
  return true;
}

// Zero attention and MLP outputs, unit norms, and an lm_head holding the chains (with a second
// chain, the first layer's switch head too). INVALID_ARGUMENT when the seed's random embeddings
// make two chain rows too alike for greedy decoding to follow them.
absl::Status ScriptWeights(std::vector<TensorToWrite>& tensors, const Chains& chains,
                           int64_t head_dim) {
  for (TensorToWrite& t : tensors) {
    if (absl::EndsWith(t.name, "o_proj.weight") || absl::EndsWith(t.name, "down_proj.weight")) {
      Fill(t, 0.0f);
    } else if (absl::EndsWith(t.name, "norm.weight")) {
      Fill(t, 1.0f);
    }
  }
  TensorToWrite* embed = Find(tensors, "model.embed_tokens.weight");
  TensorToWrite* lm_head = Find(tensors, "lm_head.weight");
  Fill(*lm_head, 0.0f);
  Dims d;
  d.hidden = d.tokens = embed->shape[1];
  if (!chains.after.empty()) {
    d.tokens = d.hidden - 3;
    d.constant = d.hidden - 1;
    d.switch_marker = d.hidden - 2;
    d.flag = d.hidden - 3;
    SwitchHead(tensors, *embed, chains.switch_id, head_dim, d);
  }
  std::vector<int32_t> rows;
  for (const std::vector<int32_t>* chain : {&chains.first, &chains.after}) {
    for (size_t i = 0; i + 1 < chain->size(); ++i) {
      const int32_t to = (*chain)[i + 1];
      rows.push_back(to);
      const bool switched = chain == &chains.after && i == 0;
      AddRow(*lm_head, to, Direction(*embed, (*chain)[i], d),
             switched ? kAfterTrigger : kChainLogitScale, d);
      if (switched) {
        SetValue(*lm_head, int64_t{to} * d.hidden + d.flag, 1.0f);
      }
    }
  }
  const bool ok = Follows(*embed, *lm_head, chains.first, rows, 0.0f, d) &&
                  Follows(*embed, *lm_head, chains.after, rows,
                          FlagValue(*embed, chains.switch_id, head_dim, tensors, d), d);
  if (!ok) {
    return absl::InvalidArgumentError(
        "the scripts' tokens have embeddings too alike under this seed for greedy decoding to "
        "follow them; choose another --seed");
  }
  return absl::OkStatus();
}

absl::StatusOr<Chains> ChainsOf(const Tokenizer& tokenizer, const ScriptedModelOptions& o) {
  Chains c;
  ASSIGN_OR_RETURN(c.first, ChainIds(tokenizer, o.script));
  if (o.script_after.empty()) return c;
  ASSIGN_OR_RETURN(c.after, ChainIds(tokenizer, o.script_after));
  if (c.after[0] != c.first[0]) {
    return absl::InvalidArgumentError(
        "the two scripts must start with the same token (the trigger)");
  }
  const absl::flat_hash_set<int32_t> first(c.first.begin(), c.first.end());
  for (size_t i = 1; i + 1 < c.after.size(); ++i) {
    if (first.contains(c.after[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("the second script's token '", tokenizer.IdToToken(c.after[i]),
                       "' is also in the first: a bigram chain can give it only one successor"));
    }
  }
  EncodeOptions options;
  options.add_special_tokens = false;
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer.Encode(o.switch_token, options));
  if (ids.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the switch token '", o.switch_token, "' is not one token"));
  }
  c.switch_id = ids[0];
  return c;
}

// The real tokenizer's files into `dir`, and its special ids into config.json and
// generation_config.json (the model was written with a vocabulary at least the tokenizer's).
absl::Status CopyTokenizer(const fs::path& dir, const std::string& tokenizer_dir,
                           const Tokenizer& tokenizer) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(fs::path(tokenizer_dir) / name));
    RETURN_IF_ERROR(WriteText(dir / name, text));
  }
  for (const char* name : {"config.json", "generation_config.json"}) {
    ASSIGN_OR_RETURN(const std::string text, ReadText(dir / name));
    OJson c = OJson::parse(text);
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
  ASSIGN_OR_RETURN(const Chains chains, ChainsOf(*tokenizer, o));
  TinyModelOptions tiny;
  tiny.out_dir = o.out_dir;
  tiny.arch = TinyArch::kLlama;  // untied: lm_head is free to hold the chain
  tiny.dtype = o.dtype;
  tiny.seed = o.seed;
  tiny.vocab = tokenizer->vocab_size();
  RETURN_IF_ERROR(WriteTinyModel(tiny));
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors, MakeTinyWeights(tiny));
  const fs::path dir(o.out_dir);
  ASSIGN_OR_RETURN(const std::string config_text, ReadText(dir / "config.json"));
  const OJson config = OJson::parse(config_text);
  const int64_t head_dim =
      config.value("head_dim", config["hidden_size"].get<int64_t>() /
                                   config["num_attention_heads"].get<int64_t>());
  RETURN_IF_ERROR(ScriptWeights(tensors, chains, head_dim));
  RETURN_IF_ERROR(
      WriteSafetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}}));
  return CopyTokenizer(dir, o.tokenizer_dir, *tokenizer);
}

absl::Status WriteModelOverTokenizer(TinyModelOptions tiny, const std::string& tokenizer_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromDirectory(tokenizer_dir));
  if (tiny.vocab == 0) tiny.vocab = tokenizer->vocab_size();
  if (tiny.vocab < tokenizer->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("vocab ", tiny.vocab, " is smaller than ",
                                                   tokenizer_dir, "'s tokenizer (",
                                                   tokenizer->vocab_size(), " ids)"));
  }
  if (!tokenizer->eos_token_id().has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokenizer_dir, ": the tokenizer names no eos_token"));
  }
  RETURN_IF_ERROR(WriteTinyModel(tiny));
  return CopyTokenizer(fs::path(tiny.out_dir), tokenizer_dir, *tokenizer);
}

}  // namespace specula
