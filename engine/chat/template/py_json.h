// Python's json.dumps on Values, which transformers' `tojson` filter is: key order kept, ", " and
// ": " separators, non-ASCII characters as they are (ensure_ascii=False), floats as repr().
#pragma once

#include <optional>
#include <string>

#include "engine/chat/template/value.h"

namespace specula::jinja::py {

struct JsonDumpsOptions {
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Throws TypeError-like errors for values JSON cannot hold (undefined, namespaces...).
std::string JsonDumps(const Value& value, const JsonDumpsOptions& options);

}  // namespace specula::jinja::py
