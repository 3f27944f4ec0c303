// `specula-bench grammar`: what structured outputs cost on the host, per schema and per token:
// the JSON Schema compile time, and the time of each step's token mask over a real vocabulary
// (the tokenizer of --tokenizer-dir), along random walks through each schema's answers (a
// random allowed token at each step, as a random-weight model would pick). Reports medians and
// the 99th percentile; the targets are a median under 50 us and a p99 under 500 us per
// row at a 128K vocabulary.
#pragma once

#include <string>

namespace specula {

struct GrammarBenchOptions {
  std::string tokenizer_dir;  // holds tokenizer.json
  std::string schemas_file;   // a JSON array of {"schema": ..., "strict": bool}
  int walks_per_schema = 4;
  int max_steps = 300;
  int mask_threads = 1;  // the masker's pool: 1 = the calling thread alone
  // The costly walks shared by every schema (grammar::SharedMaskEntries), as in the server.
  bool share_walks = true;
  // Each schema's cache prepared before its first walk (TokenMasker::Prepare), as in the server.
  bool prepare = true;
};

// Prints a Markdown table to stdout; returns a process exit code.
int RunGrammarBench(const GrammarBenchOptions& options);

}  // namespace specula
