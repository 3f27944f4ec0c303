// PCRE2 wrapper for the pre-tokenizer and normalizer patterns (Unicode properties, lookahead,
// inline case-insensitive groups). Compiled once at load; matching is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specula::tokenizer_internal {

class Regex {
 public:
  // `pattern` uses Rust-regex / Oniguruma syntax as found in tokenizer.json; the subset those
  // files use is also valid PCRE2. A literal string is escaped with `literal`.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches as [begin, end) byte ranges, left to right. `text` must be
  // valid UTF-8 (checked once at the Encode boundary).
  absl::Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*, JIT-compiled when the platform supports it
};

}  // namespace specula::tokenizer_internal
