// libFuzzer: the chat template engine (engine/chat/template): parse any source, render what
// parses with a small conversation and a tool. Errors are fine; crashes, hangs and unbounded
// output are findings (the render limits are lowered so a runaway template ends fast).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/chat/template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  specula::ChatTemplateOptions options;
  options.render.max_output_bytes = 1 << 16;
  options.render.max_loop_iterations = 100000;
  options.render.max_depth = 64;
  auto tmpl = specula::ChatTemplate::Create(source, {"<s>", "</s>", "<unk>", ""}, options);
  if (!tmpl.ok()) return 0;
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"days": 3}}}]},
    {"role": "tool", "content": "rain"}])");
  static const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])");
  (void)(*tmpl)->Render(kMessages, kTools, nullptr, true);
  return 0;
}
