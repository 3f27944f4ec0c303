// libFuzzer: OpenAI HTTP request bodies (server/openai_request.h), for both endpoints.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (specula::OpenAiEndpoint endpoint :
       {specula::OpenAiEndpoint::kChatCompletions, specula::OpenAiEndpoint::kCompletions}) {
    specula::OpenAiRequest out;
    (void)specula::ParseOpenAiRequest(endpoint, body, "tiny", &out);
  }
  return 0;
}
