#include "engine/model/tiny/tiny_tokenizer_files.h"

#include "nlohmann/json.hpp"

namespace specula {
namespace {

using OJson = nlohmann::ordered_json;

bool IsQwen(TinyArch a) { return a == TinyArch::kQwen2 || a == TinyArch::kQwen3; }

// Llama 3's pre-tokenizer pattern; Qwen's differs only in splitting digits one by one.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3 Instruct's template.
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// ChatML as Qwen2.5 writes it (without the tool-calling branches); Qwen3 has no default system.
constexpr const char* kQwen2Template =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content']"
    " + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
    "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages "
    "%}{%- if not (message.role == 'system' and loop.first) %}{{- '<|im_start|>' + message.role + "
    "'\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if "
    "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
constexpr const char* kQwen3Template =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' "
    "}}{%- endif %}";

OJson AddedToken(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

}  // namespace

std::vector<std::string> SpecialTokensFor(TinyArch arch) {
  if (IsQwen(arch)) return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
          "<|eot_id|>"};
}

TinySpecialIds SpecialIdsFor(TinyArch arch, const TinyBpeVocab& vocab) {
  TinySpecialIds ids;
  if (IsQwen(arch)) {
    ids.bos = vocab.SpecialId("<|endoftext|>");
    ids.eos = {vocab.SpecialId("<|im_end|>"), vocab.SpecialId("<|endoftext|>")};
    ids.pad = vocab.SpecialId("<|endoftext|>");
  } else {
    ids.bos = vocab.SpecialId("<|begin_of_text|>");
    ids.eos = {vocab.SpecialId("<|end_of_text|>"), vocab.SpecialId("<|eot_id|>")};
  }
  return ids;
}

std::string TokenizerJson(TinyArch arch, const TinyBpeVocab& vocab) {
  OJson added = OJson::array();
  for (const std::string& s : vocab.special_tokens)
    added.push_back(AddedToken(vocab.SpecialId(s), s));
  OJson model_vocab = OJson::object();
  const size_t n_regular = vocab.tokens.size() - vocab.special_tokens.size();
  for (size_t i = 0; i < n_regular; ++i) model_vocab[vocab.tokens[i]] = i;
  OJson merges = OJson::array();
  for (const auto& [a, b] : vocab.merges) merges.push_back(a + " " + b);

  OJson t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", IsQwen(arch) ? kQwenPattern : kLlama3Pattern}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}};
  if (IsQwen(arch)) {
    // Qwen prepends nothing; its post-processor is a ByteLevel no-op on ids.
    t["post_processor"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  } else {
    const std::string bos = "<|begin_of_text|>";
    auto special = [&](int type_id) {
      return OJson{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
    };
    auto seq = [](const char* id, int type_id) {
      return OJson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
    };
    t["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {special(0), seq("A", 0)}},
        {"pair", {special(0), seq("A", 0), special(1), seq("B", 1)}},
        {"special_tokens",
         {{bos, {{"id", bos}, {"ids", {vocab.SpecialId(bos)}}, {"tokens", {bos}}}}}}};
  }
  t["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", model_vocab},
                {"merges", merges}};
  // Raw UTF-8 for the byte-level alphabet ("Ġ"), as the Hugging Face files have it.
  return t.dump(2, ' ', /*ensure_ascii=*/false);
}

std::string TokenizerConfigJson(TinyArch arch, const TinyBpeVocab& vocab) {
  OJson decoder = OJson::object();
  for (const std::string& s : vocab.special_tokens) {
    OJson tok = AddedToken(vocab.SpecialId(s), s);
    tok.erase("id");
    decoder[std::to_string(vocab.SpecialId(s))] = tok;
  }
  OJson c;
  if (IsQwen(arch)) {
    c["add_bos_token"] = false;
    c["add_prefix_space"] = false;
    c["added_tokens_decoder"] = decoder;
    c["bos_token"] = nullptr;
    c["chat_template"] = arch == TinyArch::kQwen2 ? kQwen2Template : kQwen3Template;
    c["clean_up_tokenization_spaces"] = false;
    c["eos_token"] = "<|im_end|>";
    c["errors"] = "replace";
    c["model_max_length"] = 131072;
    c["pad_token"] = "<|endoftext|>";
    c["split_special_tokens"] = false;
    c["tokenizer_class"] = "Qwen2Tokenizer";
    c["unk_token"] = nullptr;
  } else {
    c["add_bos_token"] = true;
    c["add_eos_token"] = false;
    c["added_tokens_decoder"] = decoder;
    c["bos_token"] = "<|begin_of_text|>";
    c["chat_template"] = kLlama3Template;
    c["clean_up_tokenization_spaces"] = true;
    c["eos_token"] = "<|eot_id|>";
    c["model_input_names"] = {"input_ids", "attention_mask"};
    c["model_max_length"] = 131072;
    c["tokenizer_class"] = "PreTrainedTokenizerFast";
  }
  return c.dump(2, ' ', /*ensure_ascii=*/true);
}

}  // namespace specula
