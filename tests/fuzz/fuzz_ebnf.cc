// libFuzzer: the EBNF grammar compiler (the `grammar` output constraint) on hostile grammars, then
// the token mask and the matcher over tokens it allows: a refusal is fine, a crash, a hang, or a
// token the mask allowed and the matcher then refused is not.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/grammar/ebnf.h"
#include "engine/grammar/matcher.h"
#include "tests/fuzz/matcher_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula::grammar;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = CompileEbnf(text, /*max_symbols=*/1 << 16);
  if (!g.ok() || size == 0) return 0;
  GrammarMatcher m(*g);
  specula::fuzz::WalkAllowedTokens(m, data, size);
  return 0;
}
