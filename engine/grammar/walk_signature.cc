#include "engine/grammar/walk_signature.h"

#include <vector>

#include "absl/container/flat_hash_map.h"

namespace specula::grammar {
namespace {

// Appends the bytes of a value: the signature is compared whole, never parsed.
template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Names positions and repetitions by the order the search meets them.
class Numbering {
 public:
  int32_t Position(int32_t pos) {
    const auto [it, added] = positions_.try_emplace(pos, static_cast<int32_t>(order_.size()));
    if (added) order_.push_back(pos);
    return it->second;
  }
  int32_t Repeat(int32_t repeat) {
    if (repeat < 0) return -1;
    return repeats_.try_emplace(repeat, static_cast<int32_t>(repeats_.size())).first->second;
  }
  const std::vector<int32_t>& order() const { return order_; }

 private:
  absl::flat_hash_map<int32_t, int32_t> positions_;
  std::vector<int32_t> order_;  // grows while the search reads it
  absl::flat_hash_map<int32_t, int32_t> repeats_;
};

// The bounded-repetition count of `pos` (RepeatWatch reads it), its repetition by number.
void PutCount(const Grammar& g, int32_t pos, Numbering& n, std::string& out) {
  const CountedPosition counted = g.counted(pos);
  Put(out, n.Repeat(counted.repeat));
  Put(out, counted.repeat < 0 ? 0 : counted.count);
}

// What Step reads of `pos`; the positions it leads to are numbered (and so searched) in turn.
void Describe(const Grammar& g, int32_t pos, Numbering& n, std::string& out) {
  const PositionKind kind = g.kind(pos);
  Put(out, static_cast<uint8_t>(kind));
  PutCount(g, pos, n, out);
  switch (kind) {
    case PositionKind::kBytes:
      for (const uint64_t w : g.bytes(pos).words()) Put(out, w);
      Put(out, n.Position(pos + 1));
      break;
    case PositionKind::kRule: {
      const std::vector<int32_t>& starts = g.alternative_starts(g.referenced_rule(pos));
      Put(out, static_cast<uint32_t>(starts.size()));
      for (const int32_t start : starts) Put(out, n.Position(start));
      Put(out, n.Position(pos + 1));
      break;
    }
    case PositionKind::kEnd:
      break;
  }
}

}  // namespace

std::optional<std::string> WalkSignature(const Grammar& g, absl::Span<const int32_t> frames,
                                         bool partial, const RepeatWatch* watch,
                                         size_t max_positions) {
  std::string out;
  Put(out, static_cast<uint8_t>(partial));
  Put(out, static_cast<uint32_t>(frames.size()));
  // The watched frame's depth and the anchor's count (what the needs are counted from).
  Put(out, watch == nullptr ? uint64_t{0} : uint64_t{watch->depth} + 1);
  Put(out, watch == nullptr ? 0 : watch->anchor);
  Numbering n;
  // A frame below the top is a reference whose rule is already entered (the frame above): the
  // walk goes on after it, once that rule ends, and reads its count (RepeatWatch::NeedInside).
  // Its rule is not searched: what the walk sees of it is the frame above.
  for (size_t f = 0; f + 1 < frames.size(); ++f) {
    PutCount(g, frames[f], n, out);
    Put(out, n.Position(frames[f] + 1));
  }
  if (!frames.empty()) Put(out, n.Position(frames.back()));
  for (size_t i = 0; i < n.order().size(); ++i) {
    if (i >= max_positions) return std::nullopt;
    Describe(g, n.order()[i], n, out);
  }
  return out;
}

}  // namespace specula::grammar
