// libFuzzer: the JSON Schema compiler (structured outputs) on hostile schemas, then the matcher
// and the token mask on the compiled grammar: a refusal is fine, a crash, a hang or a mask that
// allows a token the matcher refuses is not, nor a mask from a prepared cache, sharing costly
// walks with every earlier input's grammar, that differs from the grammar's own.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "tests/fuzz/matcher_walk.h"

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
  // 22 tokens: costly at 1/4.
  static specula::fuzz::WalkVocabulary* const kVocabulary = new specula::fuzz::WalkVocabulary(
      {"{", "}", "[", "]",    "\"",    ":",    ",",     " ",   "\n",  "a", "1",
       "-", ".", "e", "true", "false", "null", "\"a\"", "{\"", "\":", "0", "\\u00e9"},
      4);
  GrammarMatcher m(*g);
  specula::fuzz::WalkAllowedTokens(m, *kVocabulary, data, size, /*max_steps=*/32, /*stride=*/1);
  return 0;
}
