// libFuzzer: the regex compiler (JSON Schema `pattern`, regex constraints) on hostile patterns,
// raw and inside a JSON string, whole and searched; then the token mask and the matcher over
// tokens it allows: a refusal is fine, a crash, a hang, or a token the mask allowed and the
// matcher then refused is not.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/grammar/matcher.h"
#include "tests/fuzz/matcher_walk.h"
#include "engine/grammar/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula::grammar;
  if (size == 0) return 0;
  RegexOptions options;
  options.text = (data[0] & 1) ? RegexText::kJsonString : RegexText::kRaw;
  options.match = (data[0] & 2) ? RegexMatch::kSearch : RegexMatch::kWhole;
  const std::string_view pattern(reinterpret_cast<const char*>(data + 1), size - 1);
  auto g = CompileRegex(pattern, options, /*max_symbols=*/1 << 16);
  if (!g.ok()) return 0;
  GrammarMatcher m(*g);
  specula::fuzz::WalkAllowedTokens(m, data, size);
  return 0;
}
