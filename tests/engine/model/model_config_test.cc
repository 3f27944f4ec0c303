#include "engine/model/model_config.h"

#include <cmath>
#include <filesystem>
#include <iterator>
#include <set>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/model/config_keys.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/safetensors_test_util.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

Json LlamaJson() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 512,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": [2, 3],
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), "cfg.json"); }

// The error is INVALID_ARGUMENT and names the file and `key`.
void ExpectRejected(const Json& j, const std::string& key) {
  auto c = Parse(j);
  ASSERT_FALSE(c.ok()) << j.dump();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  EXPECT_THAT(c.status().message(), HasSubstr(key)) << c.status();
}

TEST(ModelConfigTest, Llama3) {
  auto c = Parse(LlamaJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 160);
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2, 3));
}

TEST(ModelConfigTest, DefaultsWhenKeysAbsent) {
  Json j = LlamaJson();
  for (const char* k :
       {"num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
        "torch_dtype", "bos_token_id", "eos_token_id", "max_position_embeddings", "hidden_act"}) {
    j.erase(k);
  }
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, DType::kF32);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->max_position_embeddings, 2048);
}

TEST(ModelConfigTest, NullsCountAsAbsent) {
  Json j = LlamaJson();
  j["rope_scaling"] = nullptr;
  j["head_dim"] = nullptr;
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = 7;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_THAT(c->eos_token_ids, ElementsAre(7));
}

TEST(ModelConfigTest, RopeScalingVariants) {
  Json j = LlamaJson();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);

  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 32},
                       {"low_freq_factor", 1},
                       {"high_freq_factor", 4},
                       {"original_max_position_embeddings", 8192}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);

  j["rope_scaling"] = {{"rope_type", "default"}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ModelConfigTest, Mistral) {
  Json j = LlamaJson();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = nullptr;
  j.erase("rope_scaling");
  j.erase("max_position_embeddings");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  // A window covering the whole context is ordinary attention.
  j["sliding_window"] = 131072;
  EXPECT_TRUE(Parse(j).ok());
  j["sliding_window"] = 4096;
  ExpectRejected(j, "sliding_window");
  // MistralConfig's default window (4096) applies when the key is absent; null disables it.
  j.erase("sliding_window");
  ExpectRejected(j, "window 4096");
  j["max_position_embeddings"] = 4096;
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ModelConfigTest, Qwen2AlwaysHasAttentionBias) {
  Json j = LlamaJson();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["use_sliding_window"] = false;
  j["sliding_window"] = 32;  // ignored: disabled
  j.erase("rope_scaling");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  // Enabled, the window applies to layers from max_window_layers on (default 28, so neither of
  // these two layers); layer_types, when given, says which layers slide.
  j["use_sliding_window"] = true;
  EXPECT_TRUE(Parse(j).ok());
  j["max_window_layers"] = 1;
  ExpectRejected(j, "layer 1");
  j["max_window_layers"] = 2;
  EXPECT_TRUE(Parse(j).ok());
  j["layer_types"] = {"sliding_attention", "full_attention"};
  ExpectRejected(j, "layer 0");
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(Parse(j).ok());
  j["layer_types"] = {"full_attention"};
  ExpectRejected(j, "layer_types");
  j["layer_types"] = {"full_attention", "chunked_attention"};
  ExpectRejected(j, "layer_types");
}

TEST(ModelConfigTest, ArchitectureDefaultsFollowTransformers) {
  Json j = LlamaJson();
  j.erase("rope_scaling");
  j.erase("num_key_value_heads");
  j["num_attention_heads"] = 32;
  j["hidden_size"] = 2048;
  j["architectures"] = {"Qwen3ForCausalLM"};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);  // Qwen3Config's default, not hidden_size / heads (64)
  EXPECT_EQ(c->num_key_value_heads, 32);
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 8);
}

TEST(ModelConfigTest, BiasesAsEachArchitectureReadsThem) {
  struct Case {
    const char* arch;
    bool attention_bias, mlp_bias;  // the keys
    bool qkv, o, mlp;               // what the model has
  };
  const std::vector<Case> cases = {
      {"LlamaForCausalLM", true, true, true, true, true},
      {"LlamaForCausalLM", false, true, false, false, true},
      {"Qwen3ForCausalLM", true, true, true, true, false},
      {"Qwen2ForCausalLM", true, true, true, false, false},
      {"Qwen2ForCausalLM", false, false, true, false, false},
      {"MistralForCausalLM", true, true, false, false, false},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(absl::StrCat(t.arch, " attention_bias=", t.attention_bias, " mlp_bias=",
                              t.mlp_bias));
    Json j = LlamaJson();
    j.erase("rope_scaling");
    j["sliding_window"] = nullptr;
    j["architectures"] = {t.arch};
    j["head_dim"] = 16;
    j["attention_bias"] = t.attention_bias;
    j["mlp_bias"] = t.mlp_bias;
    auto c = Parse(j);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->attention_bias, t.qkv);
    EXPECT_EQ(c->o_proj_bias, t.o);
    EXPECT_EQ(c->mlp_bias, t.mlp);
  }
}

// transformers 5 writes rope_parameters and dtype; the same settings under either form parse to
// the same configuration.
Json Transformers5Form(Json j) {
  Json rope = j["rope_scaling"].is_null() ? Json::object() : j["rope_scaling"];
  rope["rope_theta"] = j["rope_theta"];
  if (!rope.contains("rope_type")) rope["rope_type"] = "default";
  j["rope_parameters"] = rope;
  j["dtype"] = j["torch_dtype"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  return j;
}

void ExpectSameRope(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.attention_factor, b.rope_scaling.attention_factor);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
}

TEST(ModelConfigTest, Transformers5FormMeansTheSame) {
  for (const Json& rope_scaling :
       {LlamaJson()["rope_scaling"], Json(nullptr),
        Json{{"rope_type", "linear"}, {"factor", 2.0}},
        Json{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 512}}}) {
    SCOPED_TRACE(rope_scaling.dump());
    Json classic = LlamaJson();
    classic["rope_scaling"] = rope_scaling;
    auto a = Parse(classic);
    auto b = Parse(Transformers5Form(classic));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectSameRope(*a, *b);
  }
  auto c = Parse(Transformers5Form(LlamaJson()));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
}

TEST(ModelConfigTest, BothFormsPresentMustAgree) {
  // Agreeing duplicates are fine (transformers 4.5x wrote both in some versions).
  Json both = Transformers5Form(LlamaJson());
  both["rope_theta"] = 500000;
  both["rope_scaling"] = LlamaJson()["rope_scaling"];
  both["torch_dtype"] = "bfloat16";
  auto c = Parse(both);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameRope(*c, *Parse(LlamaJson()));

  Json j = both;
  j["rope_theta"] = 10000.0;
  ExpectRejected(j, "rope_parameters.rope_theta: 500000.0 disagrees with rope_theta = 10000.0");
  j = both;
  j["rope_scaling"]["factor"] = 16.0;
  ExpectRejected(j, "rope_parameters.factor: 8.0 disagrees with rope_scaling.factor = 16.0");
  j = both;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  ExpectRejected(j, "rope_parameters.rope_type");
  j = both;
  j["torch_dtype"] = "float32";
  ExpectRejected(j, R"(dtype: "bfloat16" disagrees with torch_dtype = "float32")");
  j = both;
  j["original_max_position_embeddings"] = 128;
  ExpectRejected(j, "original_max_position_embeddings");
}

TEST(ModelConfigTest, RopeParametersRefusals) {
  const Json base = Transformers5Form(LlamaJson());
  struct Case {
    const char* key;
    Json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"rope_type", "dynamic", "rope_parameters.rope_type: 'dynamic'"},
      {"rope_type", "longrope", "rope_parameters.rope_type: unsupported rope type 'longrope'"},
      {"beta_fast", 16, "rope_parameters.beta_fast: is not a parameter of this rope type"},
      {"partial_rotary_factor", 0.5, "partial_rotary_factor"},
      {"factor", -1, "rope_parameters.factor"},
      {"rope_theta", "x", "rope_parameters.rope_theta"},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(std::string(t.key) + " = " + t.value.dump());
    Json j = base;
    j["rope_parameters"][t.key] = t.value;
    ExpectRejected(j, t.expect);
  }
  Json nested = base;
  nested["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                               {"sliding_attention", {{"rope_type", "default"}}}};
  ExpectRejected(nested, "rope_parameters.full_attention: per-layer-type");
  Json partial = base;
  partial["partial_rotary_factor"] = 0.25;
  ExpectRejected(partial, "partial_rotary_factor");
  partial["partial_rotary_factor"] = 1.0;
  EXPECT_TRUE(Parse(partial).ok());
  Json not_object = base;
  not_object["rope_parameters"] = "llama3";
  ExpectRejected(not_object, "rope_parameters");
}

TEST(ModelConfigTest, YarnSettings) {
  Json j = LlamaJson();
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0},
                       {"original_max_position_embeddings", 32768}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  const RopeScaling& s = c->rope_scaling;
  EXPECT_EQ(s.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(s.original_max_position_embeddings, 32768);
  EXPECT_EQ(s.beta_fast, 32.0);
  EXPECT_EQ(s.beta_slow, 1.0);
  EXPECT_TRUE(s.truncate);
  // get_mscale(4) = 0.1 * ln 4 + 1 (transformers 5, modeling_rope_utils.py).
  EXPECT_DOUBLE_EQ(s.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_FLOAT_EQ(c->softmax_scale(),
                  static_cast<float>(s.attention_factor * s.attention_factor / 4.0));  // hd 16
  // The original context defaults to max_position_embeddings (standardize_rope_params).
  j["rope_scaling"].erase("original_max_position_embeddings");
  EXPECT_EQ(Parse(j)->rope_scaling.original_max_position_embeddings, 131072);
  // DeepSeek-style mscales: the factor is their ratio; an explicit attention_factor wins.
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_DOUBLE_EQ(Parse(j)->rope_scaling.attention_factor,
                   (0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_DOUBLE_EQ(Parse(j)->rope_scaling.attention_factor, 1.5);
  // transformers reads `beta_fast or 32`: zero is the default too.
  j["rope_scaling"]["beta_fast"] = 0;
  j["rope_scaling"]["beta_slow"] = 2;
  j["rope_scaling"]["truncate"] = false;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c->rope_scaling.beta_slow, 2.0);
  EXPECT_FALSE(c->rope_scaling.truncate);
  j["rope_scaling"]["truncate"] = "no";
  ExpectRejected(j, "rope_scaling.truncate");
}

TEST(ModelConfigTest, UnrecognizedKeysAreListedInertOnesAreNot) {
  Json j = LlamaJson();
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["pretraining_tp"] = 1;
  j["transformers_version"] = "5.17.0";
  j["temperature"] = 0.7;
  j["zeta_mode"] = "on";
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->unrecognized_keys, ElementsAre("temperature", "zeta_mode"));
}

TEST(ModelConfigTest, LoadWarnsOnceNamingUnrecognizedKeys) {
  std::vector<std::string> lines;
  SetLogSinkForTesting([&](absl::string_view line) { lines.emplace_back(line); });
  Json j = LlamaJson();
  j["zeta_mode"] = "on";
  j["omega"] = 1;
  const std::string dir = ::testing::TempDir() + "/unrecognized_keys_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump();
  auto c = LoadModelConfig(dir);
  SetLogSinkForTesting(nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("level=warning event=model_config_unrecognized_keys"));
  EXPECT_THAT(lines[0], HasSubstr("keys=omega,zeta_mode"));
}

TEST(ModelConfigTest, Qwen3HasQkNormAndExplicitHeadDim) {
  Json j = LlamaJson();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 32;
  j["attention_bias"] = false;
  j.erase("rope_scaling");
  j.erase("max_position_embeddings");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->q_dim(), 128);
  EXPECT_EQ(c->kv_dim(), 64);
  EXPECT_EQ(c->max_position_embeddings, 32768);
}

TEST(ModelConfigTest, AttentionBiasKeyForLlama) {
  Json j = LlamaJson();
  j["attention_bias"] = true;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->o_proj_bias);  // LlamaAttention's o_proj has the bias too
}

TEST(ModelConfigTest, DtypeNames) {
  Json j = LlamaJson();
  j["torch_dtype"] = "float16";
  EXPECT_EQ(Parse(j)->torch_dtype, DType::kF16);
  j["torch_dtype"] = "float32";
  EXPECT_EQ(Parse(j)->torch_dtype, DType::kF32);
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  EXPECT_EQ(Parse(j)->torch_dtype, DType::kBF16);
}

TEST(ModelConfigTest, RejectionsNameTheKey) {
  struct Case {
    const char* key;
    Json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"architectures", Json::array({"GPT2LMHeadModel"}), "architectures"},
      {"architectures", "LlamaForCausalLM", "architectures"},
      {"architectures", nullptr, "architectures"},
      {"hidden_act", "gelu", "hidden_act"},
      {"hidden_size", 0, "hidden_size"},
      {"hidden_size", -64, "hidden_size"},
      {"hidden_size", "64", "hidden_size"},
      {"hidden_size", 64.5, "hidden_size"},
      {"intermediate_size", nullptr, "intermediate_size"},
      {"num_hidden_layers", 0, "num_hidden_layers"},
      {"num_attention_heads", -1, "num_attention_heads"},
      {"num_key_value_heads", 3, "num_key_value_heads"},
      {"head_dim", 0, "head_dim"},
      {"head_dim", 15, "head_dim"},
      {"vocab_size", nullptr, "vocab_size"},
      {"max_position_embeddings", 0, "max_position_embeddings"},
      // Once silently cut to 32 bits (2^62 -> 0, 2^32 + 100 -> 100).
      {"max_position_embeddings", int64_t{1} << 62, "max_position_embeddings: must be at most"},
      {"max_position_embeddings", (int64_t{1} << 32) + 100,
       "max_position_embeddings: must be at most 1073741824"},
      {"max_position_embeddings", (int64_t{1} << 30) + 1, "max_position_embeddings"},
      {"vocab_size", int64_t{1} << 31, "vocab_size: must be at most 2147483647"},
      {"hidden_size", int64_t{1} << 40, "hidden_size: must be at most"},
      {"num_hidden_layers", int64_t{1} << 33, "num_hidden_layers"},
      {"head_dim", 1 << 20, "head_dim"},
      {"rms_norm_eps", 0.0, "rms_norm_eps"},
      {"rope_theta", "big", "rope_theta"},
      {"rope_scaling", "llama3", "rope_scaling"},
      {"rope_scaling", {{"rope_type", "yarn"}}, "rope_scaling.factor"},
      {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}, "rope_scaling"},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}, {"mscale", 1}},
       "rope_scaling.mscale"},
      {"rope_scaling", {{"factor", 4.0}}, "rope_scaling"},
      {"rope_scaling", {{"rope_type", "linear"}}, "rope_scaling.factor"},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"low_freq_factor", 1},
        {"high_freq_factor", 4},
        {"original_max_position_embeddings", 8192}},
       "rope_scaling.factor"},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 8},
        {"low_freq_factor", 4},
        {"high_freq_factor", 4},
        {"original_max_position_embeddings", 8192}},
       "rope_scaling.high_freq_factor"},
      {"rope_scaling",
       {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1}, {"high_freq_factor", 4}},
       "rope_scaling.original_max_position_embeddings"},
      {"tie_word_embeddings", "yes", "tie_word_embeddings"},
      {"torch_dtype", "float64", "torch_dtype"},
      {"torch_dtype", "int8", "torch_dtype"},
      {"eos_token_id", "2", "eos_token_id"},
      {"eos_token_id", Json::array({2, "x"}), "eos_token_id"},
      {"eos_token_id", 512, "eos_token_id"},
      {"bos_token_id", -1, "bos_token_id"},
      {"sliding_window", 1024, "sliding_window"},
      {"sliding_window", 0, "sliding_window"},
      {"quantization_config", {{"quant_method", "gptq"}}, "quantization_config"},
      {"auto_map", {{"AutoModelForCausalLM", "modeling_x.X"}}, "auto_map"},
      {"is_encoder_decoder", true, "is_encoder_decoder"},
      {"mlp_bias", "yes", "mlp_bias"},
      {"dtype", "float8", "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    Json j = LlamaJson();
    j[c.key] = c.value;
    ExpectRejected(j, c.expect);
  }
}

TEST(ModelConfigTest, MalformedDocuments) {
  for (const char* text : {"", "{", "[]", "42", "{\"architectures\": [\"LlamaForCausalLM\"]"}) {
    auto c = ParseModelConfig(text, "cfg.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(c.status().message(), HasSubstr("cfg.json")) << text;
  }
}

TEST(ModelConfigTest, ArchitectureNamesRoundTrip) {
  for (Architecture a :
       {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    auto parsed = ParseArchitecture(ArchitectureName(a));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(ParseArchitecture("Gemma2ForCausalLM").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GenerationConfigTest, ParsesFields) {
  auto g = ParseGenerationConfig(
      R"({"bos_token_id": 1, "eos_token_id": [2, 9], "pad_token_id": 0, "do_sample": true,
          "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.0,
          "repetition_penalty": 1.1, "max_new_tokens": 256, "transformers_version": "4.51"})",
      "gen.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bos_token_id, 1);
  EXPECT_THAT(g->eos_token_ids, ElementsAre(2, 9));
  EXPECT_EQ(g->pad_token_id, 0);
  EXPECT_EQ(g->do_sample, true);
  EXPECT_DOUBLE_EQ(*g->temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g->top_p, 0.9);
  EXPECT_EQ(g->top_k, 20);
  EXPECT_DOUBLE_EQ(*g->min_p, 0.0);
  EXPECT_DOUBLE_EQ(*g->repetition_penalty, 1.1);
  EXPECT_EQ(g->max_new_tokens, 256);

  g = ParseGenerationConfig(R"({"eos_token_id": 5, "min_p": null})", "gen.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->eos_token_ids, ElementsAre(5));
  EXPECT_FALSE(g->min_p.has_value());
  EXPECT_FALSE(g->temperature.has_value());
  EXPECT_FALSE(g->bos_token_id.has_value());
}

TEST(GenerationConfigTest, RejectionsNameTheKey) {
  for (auto [text, key] : std::vector<std::pair<const char*, const char*>>{
           {R"({"eos_token_id": "2"})", "eos_token_id"},
           {R"({"temperature": "hot"})", "temperature"},
           {R"({"temperature": -1})", "temperature"},
           {R"({"top_p": 0})", "top_p"},
           {R"({"top_p": 1.5})", "top_p"},
           {R"({"top_k": 1.5})", "top_k"},
           {R"({"do_sample": 1})", "do_sample"},
           {R"({"max_new_tokens": -3})", "max_new_tokens"},
           {"[1]", "gen.json"},
           {"nope", "gen.json"}}) {
    auto g = ParseGenerationConfig(text, "gen.json");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(g.status().message(), HasSubstr(key)) << text;
    EXPECT_THAT(g.status().message(), HasSubstr("gen.json")) << text;
  }
}

TEST(ConfigFilesTest, LoadFromDirectory) {
  testing_util::ScratchDir dir;
  EXPECT_EQ(LoadModelConfig(dir.str()).status().code(), absl::StatusCode::kNotFound);
  auto empty = LoadGenerationConfig(dir.str());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->eos_token_ids.empty());
  EXPECT_FALSE(empty->temperature.has_value());

  testing_util::WriteBytes(dir.File("config.json"), LlamaJson().dump());
  testing_util::WriteBytes(dir.File("generation_config.json"), R"({"eos_token_id": [2, 3]})");
  auto c = LoadModelConfig(dir.str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 64);
  auto g = LoadGenerationConfig(dir.str());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->eos_token_ids, ElementsAre(2, 3));

  testing_util::WriteBytes(dir.File("config.json"), "{broken");
  auto bad = LoadModelConfig(dir.str());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("config.json"));
}

// docs/ENGINE_CORE.md lists the keys specula reads and those it knows to be inert; the lists
// must be exactly config_keys.cc's, in both directions.
TEST(ConfigKeysTest, DocsListEveryKeyAndNoOther) {
  std::ifstream in(std::string(SPECULA_SOURCE_DIR) + "/docs/ENGINE_CORE.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t read = doc.find("**Read**");
  const size_t inert = doc.find("**Inert**");
  const size_t rest = doc.find("**Anything else**");
  ASSERT_TRUE(read != std::string::npos && inert > read && rest > inert);
  auto backticked = [&](size_t from, size_t to) {
    std::set<std::string> out;
    for (size_t i = doc.find('`', from); i < to; i = doc.find('`', i + 1)) {
      const size_t end = doc.find('`', i + 1);
      const std::string word = doc.substr(i + 1, end - i - 1);
      // Values quoted in the list (model names, "silu") are not keys.
      if (word.find_first_of(" ,:.") == std::string::npos && word != "silu" &&
          word.find("ForCausalLM") == std::string::npos) {
        out.insert(word);
      }
      i = end;
    }
    return out;
  };
  EXPECT_EQ(backticked(read, inert), ReadConfigKeys());
  EXPECT_EQ(backticked(inert, rest), InertConfigKeys());
}

}  // namespace
}  // namespace specula
