// libFuzzer: the JSON Schema compiler (structured outputs) on hostile schemas, then the matcher
// and the token mask on the compiled grammar: a refusal is fine, a crash, a hang or a mask that
// allows a token the matcher refuses is not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_mask.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula::grammar;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  JsonSchemaOptions options;
  options.max_symbols = 1 << 16;  // small: every input stays fast
  options.strict = size % 2 == 0;
  auto g = CompileJsonSchema(schema, options);
  if (!g.ok()) return 0;
  static const std::vector<std::string> kVocab = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n",
                                                  "a", "1", "-", ".", "e", "true", "false",
                                                  "null", "\"a\"", "{\"", "\":", "0", "\\u00e9"};
  static const TokenTable kTable(kVocab);
  TokenMasker masker(kTable);
  MaskCache cache;
  GrammarMatcher m(*g);
  std::vector<uint32_t> mask;
  for (size_t step = 0; step < 32; ++step) {
    if (masker.Compute(m, &cache, &mask) == 0) break;
    // The first allowed token after an input-chosen offset: the mask must let the matcher take it.
    const size_t start = data[step % size] % kVocab.size();
    for (size_t k = 0; k < kVocab.size(); ++k) {
      const size_t id = (start + k) % kVocab.size();
      if (!MaskAllows(mask, static_cast<int64_t>(id))) continue;
      if (!m.Advance(kVocab[id])) std::abort();
      break;
    }
  }
  return 0;
}
