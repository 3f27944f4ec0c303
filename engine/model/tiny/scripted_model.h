// Models over a real Hugging Face tokenizer. A tiny model whose greedy answer is known in advance:
// the fixture of the chat end-to-end tests (a tool call the server must parse, streamed through the
// real template and tokenizer). Its layers add nothing to the residual stream (o_proj and
// down_proj are zero), so the next token depends on the current one only, and lm_head maps each
// token of the script to the next: a bigram chain. Whatever the prompt, decoding falls into the
// chain (the tokens outside it score 0) and follows it to its last token, an end-of-sequence id.
//
// With a second script, one attention head of the first layer looks for the switch token
// anywhere in the context (its key lives in the slowest-turning RoPE pair, so position barely
// matters) and writes a flag into the residual stream, which moves the trigger's successor from
// the first chain to the second.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/model/tiny/tiny_model_writer.h"

namespace specula {

struct ScriptedModelOptions {
  std::string out_dir;
  DType dtype = DType::kBF16;
  // A directory holding a real tokenizer.json and tokenizer_config.json; both are copied.
  std::string tokenizer_dir;
  // The text of the chain: its first token is the trigger (the last token of the prompt, e.g.
  // "\n" after "<|im_start|>assistant"), the rest is what the model answers, and then it ends
  // with the tokenizer's end-of-sequence token. A token may appear once in it (a bigram has one
  // successor): INVALID_ARGUMENT naming a token that repeats.
  std::string script;
  // Optional: a second chain from the same trigger, taken instead of `script` once the context
  // holds `switch_token` (one token of the tokenizer). With the default, the model calls a tool
  // (`script`) until the conversation holds a tool's result, then answers (`script_after`): an
  // agent's loop that ends. Its tokens other than the trigger may not be `script`'s.
  std::string script_after;
  std::string switch_token = "</tool_response>";
  uint64_t seed = 42;
};

absl::Status WriteScriptedModel(const ScriptedModelOptions& options);

// A random-weight model of `tiny`'s architecture and shape over the real tokenizer in
// `tokenizer_dir` (tokenizer.json and tokenizer_config.json, copied), its bos / eos ids in the
// configs: what structured outputs cost with a real vocabulary (`specula-bench constrained`).
// tiny.vocab 0 takes the tokenizer's size; a vocabulary smaller than it is INVALID_ARGUMENT.
absl::Status WriteModelOverTokenizer(TinyModelOptions tiny, const std::string& tokenizer_dir);

}  // namespace specula
