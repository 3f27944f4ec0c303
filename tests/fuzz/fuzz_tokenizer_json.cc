// libFuzzer: tokenizer.json loading, then encoding and decoding a fixed text with what loaded.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tokenizer = specula::Tokenizer::FromJson(json, "", /*max_vocab_size=*/1 << 16);
  if (!tokenizer.ok()) return 0;
  specula::EncodeOptions options;
  options.max_tokens = 4096;
  auto ids = (*tokenizer)->Encode("Hello, world! 12345 \xc3\xa9t\xc3\xa9 <|x|>\n\n  tabs\t", options);
  if (ids.ok()) (void)(*tokenizer)->Decode(*ids, /*skip_special_tokens=*/false);
  return 0;
}
