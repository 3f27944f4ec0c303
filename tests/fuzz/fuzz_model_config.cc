// libFuzzer: config.json and generation_config.json of a model directory.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)specula::ParseModelConfig(text, "config.json");
  (void)specula::ParseGenerationConfig(text, "generation_config.json");
  return 0;
}
