// Helpers shared by the chat-template tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/template/evaluator.h"
#include "nlohmann/json.hpp"

namespace specula::chat_template_test {

std::string ReadFile(const std::string& path);

// The local time strftime_now() sees in the tests: 2024-07-26 10:30:15.250000, as
// render_reference.py's FIXED_NOW.
jinja::LocalTime FixedNow();

// A template snippet of snippets.txt (format in its header).
struct Snippet {
  std::string name;
  std::string source;
  nlohmann::ordered_json context;
};
std::vector<Snippet> LoadSnippets(const std::string& path);

// Where `actual` first departs from `expected`, with both sides around it, escaped.
std::string DescribeMismatch(std::string_view expected, std::string_view actual);

}  // namespace specula::chat_template_test
