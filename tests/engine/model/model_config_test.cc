#include "engine/model/model_config.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
  j["use_sliding_window"] = true;
  ExpectRejected(j, "sliding_window");
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
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "rope_scaling"},
      {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}, "rope_scaling"},
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
      {"quantization_config", {{"quant_method", "gptq"}}, "quantization_config"},
      {"mlp_bias", true, "mlp_bias"},
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

}  // namespace
}  // namespace specula
