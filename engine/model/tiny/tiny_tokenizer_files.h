// tokenizer.json / tokenizer_config.json for the tiny models, in the style of each family:
// Llama 3 specials and chat template for llama/llama3/mistral, ChatML for qwen2/qwen3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/tiny/tiny_bpe_vocab.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {

std::vector<std::string> SpecialTokensFor(TinyArch arch);

struct TinySpecialIds {
  int64_t bos = -1;
  std::vector<int64_t> eos;  // generation stops on any of these
  int64_t pad = -1;          // -1: none
};
TinySpecialIds SpecialIdsFor(TinyArch arch, const TinyBpeVocab& vocab);

std::string TokenizerJson(TinyArch arch, const TinyBpeVocab& vocab);
std::string TokenizerConfigJson(TinyArch arch, const TinyBpeVocab& vocab);

}  // namespace specula
