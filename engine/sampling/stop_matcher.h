// Finds stop strings in streamed text across token boundaries. Text that might be the start of a
// stop string is held back until it is known not to be one; the stop string itself and anything
// after it are never emitted. One per sequence; not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace specula {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed; `text` is everything before it
  };
  // Feeds newly decoded text. After a stop, further pushes return {"", true}.
  Result Push(std::string_view text);
  // End of generation for another reason: releases the held-back text.
  std::string Flush();

 private:
  // Length of the longest suffix of `text` that is a proper prefix of some stop string.
  size_t PartialMatchLength(std::string_view text) const;

  std::vector<std::string> stops_;
  std::string held_;
  size_t max_stop_len_ = 0;
  bool stopped_ = false;
};

}  // namespace specula
