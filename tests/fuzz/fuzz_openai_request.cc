// libFuzzer: OpenAI HTTP request bodies (server/openai_request.h, server/responses_request.h),
// for every endpoint; a Responses body's items are also merged into a conversation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_request.h"
#include "server/responses_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (specula::OpenAiEndpoint endpoint :
       {specula::OpenAiEndpoint::kChatCompletions, specula::OpenAiEndpoint::kCompletions}) {
    specula::OpenAiRequest out;
    (void)specula::ParseOpenAiRequest(endpoint, body, "tiny", &out);
  }
  specula::ResponsesRequest responses;
  if (!specula::ParseResponsesRequest(body, "tiny", &responses)) {
    (void)specula::MergeConversation(responses.instructions, {&responses.input_messages});
  }
  return 0;
}
