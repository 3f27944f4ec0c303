// make-tiny-model: writes a deterministic random-weight Hugging Face model directory.
//   make-tiny-model --out /tmp/tiny --arch qwen3 [--preset tiny|100m] [--dtype f32|f16|bf16]
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/model/tiny/scripted_model.h"
#include "engine/model/tiny/tiny_model_writer.h"
#include "tools/common/dashed_flags.h"

ABSL_FLAG(std::string, out, "", "output directory (required)");
ABSL_FLAG(std::string, arch, "llama", "llama|llama3|mistral|qwen2|qwen3");
ABSL_FLAG(std::string, preset, "tiny", "tiny (test fixture) or 100m (CPU benchmark)");
ABSL_FLAG(std::string, dtype, "", "f32|f16|bf16; default f32 for tiny, bf16 for 100m");
ABSL_FLAG(uint64_t, seed, 42, "random seed; same seed and flags give identical files");
ABSL_FLAG(int32_t, shards, 1, "number of safetensors shards (>1 writes an index)");
ABSL_FLAG(int64_t, layers, 0, "override num_hidden_layers (0: preset)");
ABSL_FLAG(int64_t, hidden, 0, "override hidden_size (0: preset)");
ABSL_FLAG(int64_t, heads, 0, "override num_attention_heads (0: preset)");
ABSL_FLAG(int64_t, kv_heads, 0, "override num_key_value_heads (0: preset)");
ABSL_FLAG(int64_t, head_dim, 0, "override head_dim (0: preset, or hidden/heads)");
ABSL_FLAG(int64_t, intermediate, 0, "override intermediate_size (0: preset)");
ABSL_FLAG(int64_t, max_position_embeddings, 0, "override max_position_embeddings (0: preset)");
ABSL_FLAG(
    int64_t, vocab, 0,
    "override vocab_size, >= the tokenizer's size (512 for the generated one; 0: the preset's, "
    "or with --tokenizer_dir the tokenizer's)");
ABSL_FLAG(bool, biases, false,
          "every bias attention_bias / mlp_bias can switch on (llama*, qwen3)");
ABSL_FLAG(std::string, rope, "", "rope scaling instead of the architecture's: yarn");
ABSL_FLAG(std::string, config_form, "v4",
          "config.json as transformers 4 (v4: rope_theta, rope_scaling, torch_dtype) or 5 (v5: "
          "rope_parameters, dtype) saves it");
ABSL_FLAG(std::string, script, "",
          "write a scripted model instead (engine/model/tiny/scripted_model.h): its greedy "
          "answer is this text after its first token; needs --tokenizer_dir");
ABSL_FLAG(std::string, script_after, "",
          "with --script: a second answer, given once the conversation holds --switch_token (a "
          "tool's result): the model calls a tool, then answers from its result");
ABSL_FLAG(std::string, switch_token, "</tool_response>",
          "with --script_after: the one token whose presence switches the answer");
ABSL_FLAG(std::string, tokenizer_dir, "",
          "a directory holding a real tokenizer.json and tokenizer_config.json: with --script, the "
          "scripted model's; without, a random-weight model of the other flags' shape over it "
          "(its bos / eos ids in the configs; --vocab 0 takes the tokenizer's size)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Writes a random-weight HF model directory for tests/benchmarks.");
  std::vector<std::string> storage;
  specula::ParseDashedCommandLine(argc, argv, &storage);
  specula::TinyModelOptions o;
  o.out_dir = absl::GetFlag(FLAGS_out);
  auto arch = specula::ParseTinyArch(absl::GetFlag(FLAGS_arch));
  if (!arch.ok()) {
    std::fprintf(stderr, "make-tiny-model: %s\n", std::string(arch.status().message()).c_str());
    return 2;
  }
  o.arch = *arch;
  o.preset = absl::GetFlag(FLAGS_preset);
  std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype.empty()) dtype = o.preset == "100m" ? "bf16" : "f32";
  if (dtype == "f32") {
    o.dtype = specula::DType::kF32;
  } else if (dtype == "f16") {
    o.dtype = specula::DType::kF16;
  } else if (dtype == "bf16") {
    o.dtype = specula::DType::kBF16;
  } else {
    std::fprintf(stderr, "make-tiny-model: unknown --dtype '%s' (f32|f16|bf16)\n", dtype.c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_script).empty()) {
    specula::ScriptedModelOptions scripted;
    scripted.out_dir = o.out_dir;
    scripted.dtype = o.dtype;
    scripted.tokenizer_dir = absl::GetFlag(FLAGS_tokenizer_dir);
    scripted.script = absl::GetFlag(FLAGS_script);
    scripted.script_after = absl::GetFlag(FLAGS_script_after);
    scripted.switch_token = absl::GetFlag(FLAGS_switch_token);
    scripted.seed = absl::GetFlag(FLAGS_seed);
    const absl::Status status = specula::WriteScriptedModel(scripted);
    if (!status.ok()) {
      std::fprintf(stderr, "make-tiny-model: %s\n", status.ToString().c_str());
      return 1;
    }
    return 0;
  }
  o.seed = absl::GetFlag(FLAGS_seed);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.hidden = absl::GetFlag(FLAGS_hidden);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.intermediate = absl::GetFlag(FLAGS_intermediate);
  o.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  o.vocab = absl::GetFlag(FLAGS_vocab);
  o.biases = absl::GetFlag(FLAGS_biases);
  o.rope = absl::GetFlag(FLAGS_rope);
  o.config_form = absl::GetFlag(FLAGS_config_form);
  const std::string tokenizer_dir = absl::GetFlag(FLAGS_tokenizer_dir);
  const absl::Status status = tokenizer_dir.empty()
                                  ? specula::WriteTinyModel(o)
                                  : specula::WriteModelOverTokenizer(o, tokenizer_dir);
  if (!status.ok()) {
    std::fprintf(stderr, "make-tiny-model: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
