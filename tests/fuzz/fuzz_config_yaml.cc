// libFuzzer: the YAML server config (server/config.h). Any input is a config or an error naming
// the key; never a crash, a hang or an exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<specula::ServerConfig> config = specula::ParseConfigYaml(text, "fuzz.yaml");
  if (config.ok() && !specula::ValidateConfig(*config).ok()) __builtin_trap();  // parsed = valid
  return 0;
}
