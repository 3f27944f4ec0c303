#include "engine/chat/output/text_scan.h"

#include <algorithm>

namespace specula::chat_output_internal {

size_t SkipSpace(std::string_view text, size_t pos) {
  while (pos < text.size() && IsSpace(text[pos])) ++pos;
  return pos;
}

size_t PartialTagLength(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t len = std::min(text.size(), tag.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

std::string_view StripLeadingNewlines(std::string_view text) {
  const size_t first = text.find_first_not_of('\n');
  return first == std::string_view::npos ? std::string_view() : text.substr(first);
}

std::string_view StripTrailingNewlines(std::string_view text) {
  const size_t last = text.find_last_not_of('\n');
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}

}  // namespace specula::chat_output_internal
