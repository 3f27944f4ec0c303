#include "engine/sampling/stop_matcher.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace specula {
namespace {

bool IsContinuationByte(unsigned char c) { return (c & 0xC0) == 0x80; }

// Bytes a UTF-8 sequence occupies, from its lead byte (1 for anything malformed, so a bad byte
// never holds text back forever).
size_t SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Moves `pos` back to the start of the UTF-8 character that contains it, so splitting there
// leaves both halves valid.
size_t CharBoundaryAtOrBefore(std::string_view text, size_t pos) {
  size_t steps = 0;
  while (pos > 0 && pos < text.size() && IsContinuationByte(text[pos]) && steps < 3) {
    --pos;
    ++steps;
  }
  return pos;
}

// Start of a trailing incomplete UTF-8 sequence, or text.size() if the text ends on a complete
// character. Inputs are meant to be whole characters; this only guards against a detokenizer
// that splits one, so that we never emit half a character.
size_t IncompleteTailStart(std::string_view text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = text[n - back];
    if (IsContinuationByte(c)) continue;
    return SequenceLength(c) > back ? n - back : n;
  }
  return n;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  // An empty stop string would match everywhere; validation rejects it, and here it is ignored.
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

size_t StopMatcher::PartialMatchLength(std::string_view text) const {
  if (max_stop_len_ == 0) return 0;
  for (size_t len = std::min(text.size(), max_stop_len_ - 1); len > 0; --len) {
    const std::string_view suffix = text.substr(text.size() - len);
    for (const std::string& s : stops_) {
      if (s.size() > len && std::string_view(s).starts_with(suffix)) return len;
    }
  }
  return 0;
}

StopMatcher::Result StopMatcher::Push(std::string_view text) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  held_.append(text);
  const std::string_view buf = held_;

  // The held text never contains a whole stop string (we would have stopped), so any match ends
  // in the new text. The earliest-ending match wins, as if the text had arrived byte by byte; on
  // a tie the longer (earlier-starting) one wins so no part of either stop string is emitted. A
  // stop string's first occurrence is also its earliest-ending one.
  size_t best_start = std::string_view::npos;
  size_t best_end = std::string_view::npos;
  for (const std::string& s : stops_) {
    const size_t pos = buf.find(s);
    if (pos == std::string_view::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_start)) {
      best_start = pos;
      best_end = end;
    }
  }
  if (best_start != std::string_view::npos) {
    result.text.assign(buf.substr(0, best_start));
    result.stopped = true;
    stopped_ = true;
    held_.clear();
    return result;
  }

  size_t emit = buf.size() - PartialMatchLength(buf);
  emit = std::min(emit, IncompleteTailStart(buf));
  emit = CharBoundaryAtOrBefore(buf, emit);
  result.text.assign(buf.substr(0, emit));
  held_.erase(0, emit);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace specula
