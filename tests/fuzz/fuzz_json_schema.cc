// libFuzzer: the JSON Schema compiler (structured outputs) on hostile schemas, then the matcher
// and the token mask on the compiled grammar: a refusal is fine, a crash, a hang or a mask that
// allows a token the matcher refuses is not, nor a mask from a prepared cache, sharing costly
// walks with every earlier input's grammar, that differs from the grammar's own.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/shared_mask_entries.h"
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
  static SharedMaskEntries kShared;
  // Costly as a real vocabulary's 1/64 is: this one has 22 tokens.
  TokenMasker masker(kTable, {.shared = &kShared, .costly_fraction = 4});
  TokenMasker own_masker(kTable);
  MaskCache cache, own;
  masker.Prepare(**g, &cache, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  GrammarMatcher m(*g);
  std::vector<uint32_t> mask, own_mask;
  for (size_t step = 0; step < 32; ++step) {
    const int64_t allowed = masker.Compute(m, &cache, &mask);
    if (own_masker.Compute(m, &own, &own_mask) != allowed || own_mask != mask) std::abort();
    if (allowed == 0) break;
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
