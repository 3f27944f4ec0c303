// make-tiny-model's writer: every architecture variant reloads through WeightFiles and
// LoadModelConfig with the shapes and features of its family, and output is deterministic.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny/scripted_model.h"
#include "engine/model/tiny/tiny_model_writer.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/safetensors_test_util.h"

namespace specula {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using testing_util::ReadBytes;
using testing_util::ScratchDir;

constexpr TinyArch kAllArchs[] = {TinyArch::kLlama, TinyArch::kLlama3, TinyArch::kMistral,
                                  TinyArch::kQwen2, TinyArch::kQwen3};

TinyModelOptions Options(const std::string& dir, TinyArch arch) {
  TinyModelOptions o;
  o.out_dir = dir;
  o.arch = arch;
  return o;
}

float ElementAsFloat(const TensorView& v, int64_t i) {
  if (v.dtype == DType::kF32) {
    float f;
    std::memcpy(&f, v.data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, v.data + 2 * i, 2);
  return v.dtype == DType::kF16 ? F16ToFloat(h) : Bf16ToFloat(h);
}

double Rms(const TensorView& v) {
  double sum = 0;
  for (int64_t i = 0; i < v.numel(); ++i)
    sum += double(ElementAsFloat(v, i)) * ElementAsFloat(v, i);
  return std::sqrt(sum / double(v.numel()));
}

class TinyModelArchTest : public ::testing::TestWithParam<TinyArch> {};

TEST_P(TinyModelArchTest, ReloadsWithFamilyFeatures) {
  const TinyArch arch = GetParam();
  ScratchDir dir;
  ASSERT_TRUE(WriteTinyModel(Options(dir.str(), arch)).ok());

  auto config = LoadModelConfig(dir.str());
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig& c = *config;
  const Architecture expected_arch = arch == TinyArch::kMistral ? Architecture::kMistral
                                     : arch == TinyArch::kQwen2 ? Architecture::kQwen2
                                     : arch == TinyArch::kQwen3 ? Architecture::kQwen3
                                                                : Architecture::kLlama;
  EXPECT_EQ(c.architecture, expected_arch);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, arch == TinyArch::kQwen3 ? 32 : 16);
  EXPECT_EQ(c.intermediate_size, 160);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.torch_dtype, DType::kF32);
  EXPECT_EQ(c.tie_word_embeddings, arch != TinyArch::kLlama && arch != TinyArch::kMistral);
  EXPECT_EQ(c.attention_bias, arch == TinyArch::kQwen2);
  EXPECT_EQ(c.qk_norm, arch == TinyArch::kQwen3);
  if (arch == TinyArch::kLlama3) {
    EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
    EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  } else {
    EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  }
  if (arch == TinyArch::kLlama) {
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  }

  auto files = WeightFiles::OpenDirectory(dir.str());
  ASSERT_TRUE(files.ok()) << files.status();
  const WeightFiles& w = **files;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), inter = c.intermediate_size;
  std::set<std::string> expected;
  auto require = [&](const std::string& name, std::vector<int64_t> shape) {
    expected.insert(name);
    auto v = w.Require(name, shape);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : nullptr;
  };
  const TensorView* embed = require("model.embed_tokens.weight", {c.vocab_size, h});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const TensorView* ln = require(p + "input_layernorm.weight", {h});
    if (ln != nullptr) {
      EXPECT_NEAR(Rms(*ln), 1.0, 0.1);
    }
    require(p + "self_attn.q_proj.weight", {q, h});
    require(p + "self_attn.k_proj.weight", {kv, h});
    require(p + "self_attn.v_proj.weight", {kv, h});
    const TensorView* o = require(p + "self_attn.o_proj.weight", {h, q});
    if (o != nullptr) {
      EXPECT_NEAR(Rms(*o), 1.0 / std::sqrt(double(q)), 0.02);
    }
    if (arch == TinyArch::kQwen2) {
      for (auto [name, n] : {std::pair{"q", q}, {"k", kv}, {"v", kv}}) {
        const TensorView* b = require(p + "self_attn." + name + "_proj.bias", {n});
        if (b != nullptr) {
          EXPECT_GT(Rms(*b), 0.1) << "biases must be clearly nonzero";
        }
      }
    }
    if (arch == TinyArch::kQwen3) {
      require(p + "self_attn.q_norm.weight", {c.head_dim});
      require(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    require(p + "post_attention_layernorm.weight", {h});
    require(p + "mlp.gate_proj.weight", {inter, h});
    require(p + "mlp.up_proj.weight", {inter, h});
    require(p + "mlp.down_proj.weight", {h, inter});
  }
  require("model.norm.weight", {h});
  if (!c.tie_word_embeddings) require("lm_head.weight", {c.vocab_size, h});
  const std::vector<std::string> names = w.Names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
  // Tied logits are h . embedding: embeddings scaled so their std is ~4 for unit-RMS h.
  ASSERT_NE(embed, nullptr);
  EXPECT_NEAR(Rms(*embed) * std::sqrt(double(h)), c.tie_word_embeddings ? 4.0 : 8.0, 0.5);

  // Tokenizer files agree with the configs.
  const Json tok = Json::parse(ReadBytes(dir.File("tokenizer.json")));
  const size_t n_vocab = tok["model"]["vocab"].size() + tok["added_tokens"].size();
  EXPECT_EQ(n_vocab, 512u);
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["model"]["byte_fallback"], false);
  EXPECT_GE(tok["model"]["merges"].size(), 200u);
  EXPECT_EQ(tok["pre_tokenizer"]["pretokenizers"][0]["behavior"], "Isolated");
  std::map<int64_t, std::string> specials;
  for (const Json& t : tok["added_tokens"]) specials[t["id"].get<int64_t>()] = t["content"];
  const bool qwen = arch == TinyArch::kQwen2 || arch == TinyArch::kQwen3;
  auto gen = LoadGenerationConfig(dir.str());
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_TRUE(gen->bos_token_id.has_value());
  EXPECT_EQ(gen->bos_token_id, c.bos_token_id);
  EXPECT_EQ(specials[*gen->bos_token_id], qwen ? "<|endoftext|>" : "<|begin_of_text|>");
  std::set<std::string> eos;
  for (int64_t id : gen->eos_token_ids) eos.insert(specials[id]);
  EXPECT_TRUE(eos.count(qwen ? "<|im_end|>" : "<|eot_id|>"));
  for (int64_t id : c.eos_token_ids) {
    EXPECT_NE(std::find(gen->eos_token_ids.begin(), gen->eos_token_ids.end(), id),
              gen->eos_token_ids.end());
  }
  const Json tc = Json::parse(ReadBytes(dir.File("tokenizer_config.json")));
  EXPECT_THAT(tc["chat_template"].get<std::string>(),
              HasSubstr(qwen ? "<|im_start|>" : "<|start_header_id|>"));
  EXPECT_EQ(tc["eos_token"], qwen ? "<|im_end|>" : "<|eot_id|>");
  EXPECT_EQ(tc["add_bos_token"], !qwen);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, TinyModelArchTest, ::testing::ValuesIn(kAllArchs),
                         [](const auto& info) { return TinyArchName(info.param); });

std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out[e.path().filename().string()] = ReadBytes(e.path().string());
  }
  return out;
}

TEST(TinyModelTest, DeterministicForASeed) {
  ScratchDir a, b, c;
  TinyModelOptions o = Options(a.str(), TinyArch::kQwen2);
  ASSERT_TRUE(WriteTinyModel(o).ok());
  o.out_dir = b.str();
  ASSERT_TRUE(WriteTinyModel(o).ok());
  const auto first = DirContents(a.str());
  EXPECT_EQ(first.size(), 5u);
  EXPECT_EQ(first, DirContents(b.str()));
  o.out_dir = c.str();
  o.seed = 7;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  const auto other = DirContents(c.str());
  EXPECT_NE(first.at("model.safetensors"), other.at("model.safetensors"));
  EXPECT_EQ(first.at("tokenizer.json"), other.at("tokenizer.json"));
}

TEST(TinyModelTest, ShardsHoldTheSameTensors) {
  ScratchDir single, sharded;
  TinyModelOptions o = Options(single.str(), TinyArch::kLlama);
  o.dtype = DType::kBF16;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  o.out_dir = sharded.str();
  o.shards = 3;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  EXPECT_TRUE(std::filesystem::exists(sharded.File("model.safetensors.index.json")));
  EXPECT_TRUE(std::filesystem::exists(sharded.File("model-00003-of-00003.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(sharded.File("model.safetensors")));
  auto one = WeightFiles::OpenDirectory(single.str());
  auto many = WeightFiles::OpenDirectory(sharded.str());
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ((*one)->Names(), (*many)->Names());
  std::set<std::string> files;
  for (const std::string& name : (*one)->Names()) {
    const TensorView* x = (*one)->Find(name);
    const TensorView* y = (*many)->Find(name);
    EXPECT_EQ(x->dtype, DType::kBF16);
    ASSERT_EQ(x->nbytes, y->nbytes);
    EXPECT_EQ(std::memcmp(x->data, y->data, x->nbytes), 0) << name;
    files.insert(y->file);
  }
  EXPECT_EQ(files.size(), 3u);

  // Rewriting as one file removes the stale shards.
  o.shards = 1;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  EXPECT_FALSE(std::filesystem::exists(sharded.File("model.safetensors.index.json")));
  EXPECT_FALSE(std::filesystem::exists(sharded.File("model-00001-of-00003.safetensors")));
}

TEST(TinyModelTest, OverridesAndDtypes) {
  ScratchDir dir;
  TinyModelOptions o = Options(dir.str(), TinyArch::kMistral);
  o.dtype = DType::kF16;
  o.layers = 3;
  o.hidden = 96;
  o.heads = 6;
  o.kv_heads = 3;
  o.intermediate = 128;
  o.max_position_embeddings = 1024;
  o.vocab = 600;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  auto c = LoadModelConfig(dir.str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->vocab_size, 600);
  EXPECT_EQ(c->torch_dtype, DType::kF16);
  EXPECT_EQ(c->max_position_embeddings, 1024);
  auto w = WeightFiles::OpenDirectory(dir.str());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(
      (*w)->Require("model.layers.2.mlp.down_proj.weight", std::vector<int64_t>{96, 128}).ok());
  EXPECT_EQ((*w)->Find("lm_head.weight")->dtype, DType::kF16);
}

TEST(TinyModelTest, RejectsBadOptions) {
  ScratchDir dir;
  TinyModelOptions o = Options(dir.str(), TinyArch::kLlama);
  o.vocab = 100;
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("vocab"));
  o = Options(dir.str(), TinyArch::kLlama);
  o.kv_heads = 3;
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("kv_heads"));
  o = Options(dir.str(), TinyArch::kLlama);
  o.preset = "7b";
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("preset"));
  o = Options("", TinyArch::kLlama);
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("--out"));
  o = Options(dir.str(), TinyArch::kLlama);
  o.shards = 1000;
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("shards"));
  o = Options(dir.str(), TinyArch::kMistral);
  o.biases = true;
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("--biases"));
  o = Options(dir.str(), TinyArch::kLlama);
  o.rope = "dynamic";
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("--rope"));
  o = Options(dir.str(), TinyArch::kLlama);
  o.config_form = "v6";
  EXPECT_THAT(WriteTinyModel(o).message(), HasSubstr("--config_form"));
  EXPECT_FALSE(ParseTinyArch("gpt2").ok());
  for (TinyArch a : kAllArchs) EXPECT_EQ(*ParseTinyArch(TinyArchName(a)), a);
}

// make-tiny-model --tokenizer_dir without --script: the shape and architecture of the options,
// the tokenizer's files as they are, and its special ids in both configs (the constrained
// bench's model over a real vocabulary). Another architecture's tokenizer stands in for a
// real one: its ids differ from what the written architecture would name on its own.
TEST(TinyModelTest, ARandomModelOverATokenizerCarriesItsFilesAndSpecialIds) {
  ScratchDir tokenizer_dir, out, plain;
  ASSERT_TRUE(WriteTinyModel(Options(tokenizer_dir.str(), TinyArch::kLlama)).ok());
  const std::unique_ptr<Tokenizer> tokenizer =
      Tokenizer::FromDirectory(tokenizer_dir.str()).value();
  TinyModelOptions o = Options(out.str(), TinyArch::kQwen3);
  o.vocab = 600;
  ASSERT_TRUE(WriteModelOverTokenizer(o, tokenizer_dir.str()).ok());
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(ReadBytes(out.File(name)), ReadBytes(tokenizer_dir.File(name))) << name;
  }
  ASSERT_TRUE(WriteTinyModel(Options(plain.str(), TinyArch::kQwen3)).ok());
  const Json own = Json::parse(ReadBytes(plain.File("config.json")));
  const Json config = Json::parse(ReadBytes(out.File("config.json")));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["vocab_size"], 600);
  EXPECT_EQ(config["eos_token_id"], *tokenizer->eos_token_id());
  EXPECT_EQ(config["bos_token_id"], *tokenizer->bos_token_id());
  // What qwen3 names on its own differs (bos 509; eos a list of two), so the checks above see
  // the tokenizer's ids written over it.
  EXPECT_NE(own["bos_token_id"], *tokenizer->bos_token_id());
  EXPECT_TRUE(own["eos_token_id"].is_array());
  const Json generation = Json::parse(ReadBytes(out.File("generation_config.json")));
  EXPECT_EQ(generation["eos_token_id"], *tokenizer->eos_token_id());
  EXPECT_TRUE(LoadModelConfig(out.str()).ok());

  // Vocabulary 0: the tokenizer's size (512), not the preset's (100m: 32,000), in a small shape.
  o.preset = "100m";
  o.layers = 1;
  o.hidden = 64;
  o.heads = 2;
  o.kv_heads = 1;
  o.intermediate = 64;
  o.vocab = 0;
  ASSERT_TRUE(WriteModelOverTokenizer(o, tokenizer_dir.str()).ok());
  EXPECT_EQ(Json::parse(ReadBytes(out.File("config.json")))["vocab_size"], tokenizer->vocab_size());
  o.vocab = tokenizer->vocab_size() - 1;
  // Refused naming the tokenizer it was checked against (the writer's own check names none).
  EXPECT_THAT(WriteModelOverTokenizer(o, tokenizer_dir.str()).message(),
              HasSubstr(tokenizer_dir.str() + "'s tokenizer (512 ids)"));
}

// The transformers 5 form of a config carries the same settings under rope_parameters and dtype,
// and the same weights.
TEST(TinyModelTest, Transformers5FormHasTheSameSettingsAndWeights) {
  ScratchDir classic_dir, v5_dir;
  TinyModelOptions o = Options(classic_dir.str(), TinyArch::kLlama3);
  ASSERT_TRUE(WriteTinyModel(o).ok());
  o.out_dir = v5_dir.str();
  o.config_form = "v5";
  ASSERT_TRUE(WriteTinyModel(o).ok());
  const nlohmann::json v5 = nlohmann::json::parse(std::ifstream(v5_dir.str() + "/config.json"));
  EXPECT_FALSE(v5.contains("rope_theta"));
  EXPECT_FALSE(v5.contains("rope_scaling"));
  EXPECT_FALSE(v5.contains("torch_dtype"));
  EXPECT_EQ(v5["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(v5["rope_parameters"]["rope_theta"], 500000.0);
  EXPECT_EQ(v5["dtype"], "float32");
  auto a = LoadModelConfig(classic_dir.str());
  auto b = LoadModelConfig(v5_dir.str());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rope_theta, b->rope_theta);
  EXPECT_EQ(a->rope_scaling.factor, b->rope_scaling.factor);
  std::ifstream wa(classic_dir.str() + "/model.safetensors", std::ios::binary);
  std::ifstream wb(v5_dir.str() + "/model.safetensors", std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(wa), std::istreambuf_iterator<char>(),
                         std::istreambuf_iterator<char>(wb)));
}

TEST(TinyModelTest, BiasesAreWrittenWhereTheConfigSwitchesThemOn) {
  ScratchDir dir;
  TinyModelOptions o = Options(dir.str(), TinyArch::kLlama);
  o.biases = true;
  ASSERT_TRUE(WriteTinyModel(o).ok());
  auto c = LoadModelConfig(dir.str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias && c->o_proj_bias && c->mlp_bias);
  auto w = WeightFiles::OpenDirectory(dir.str());
  ASSERT_TRUE(w.ok());
  for (const char* name : {"self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.down_proj.bias"}) {
    EXPECT_NE((*w)->Find(std::string("model.layers.1.") + name), nullptr) << name;
  }
}

}  // namespace
}  // namespace specula
