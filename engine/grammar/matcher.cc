#include "engine/grammar/matcher.h"

#include <algorithm>
#include <deque>
#include <utility>

namespace specula::grammar {

void StackSet::Clear() {
  frames_.clear();
  offsets_.resize(1);
  hashes_.clear();
  tags_.clear();
}

namespace {

uint64_t HashOf(absl::Span<const int32_t> stack) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the frames
  for (const int32_t f : stack) h = (h ^ static_cast<uint32_t>(f)) * 1099511628211ull;
  return h;
}

}  // namespace

bool StackSet::Add(absl::Span<const int32_t> stack, uint16_t tag) {
  const uint64_t h = HashOf(stack);
  for (size_t i = 0; i < size(); ++i) {
    // Tagged stacks with equal frames have equal futures: one stands for both, with the lesser
    // need. A tagged and an untagged one stay apart (the untagged one's need changes as it goes).
    if (hashes_[i] != h || (tags_[i] == kNoTag) != (tag == kNoTag) ||
        !std::equal(begin(i), end(i), stack.begin(), stack.end())) {
      continue;
    }
    tags_[i] = std::min(tags_[i], tag);
    return true;
  }
  if (size() >= kMaxStacks) return false;
  frames_.insert(frames_.end(), stack.begin(), stack.end());
  offsets_.push_back(static_cast<uint32_t>(frames_.size()));
  hashes_.push_back(h);
  tags_.push_back(tag);
  return true;
}

namespace {

// Scratch stacks, one per recursion depth of Expand, kept between calls so that stepping
// allocates nothing once warm. A deque: growing it keeps the references held by shallower calls.
std::deque<std::vector<int32_t>>& ScratchStacks() {
  thread_local std::deque<std::vector<int32_t>> stacks;
  return stacks;
}

std::vector<int32_t>& Scratch(size_t depth) {
  std::deque<std::vector<int32_t>>& stacks = ScratchStacks();
  if (stacks.size() <= depth) stacks.resize(depth + 1);
  return stacks[depth];
}

// What one Step's expansions share.
struct Expansion {
  const Grammar& g;
  StackSet* out;
  bool* escaped;
  int next;
  RepeatWatch* watch;
};

// Adds to `out` every stack `stack` stands for once its top is a byte symbol (or it is empty):
// an alternative's end returns to the referring position's successor, a rule reference opens
// each alternative. A reference that is the last symbol of its alternative replaces its frame
// (a tail call), so right recursion (repetition) keeps stacks shallow. `stack` is scratch at
// `depth`. With `escaped`, the stack is the top of a longer one: ending it sets *escaped instead
// of adding the empty stack. With `next` >= 0, only stacks that take that byte are added. False
// when `out` overflowed.
bool Expand(const Expansion& e, std::vector<int32_t>& stack, size_t depth, uint16_t tag) {
  // GrammarBuilder::Build bounds the expansions from entering a rule; a deep stack's parents can
  // add theirs: past this, the parse is dropped as on an overflow, not followed off the stack.
  constexpr size_t kMaxDepth = 4096;
  if (depth > kMaxDepth) return false;
  while (!stack.empty()) {
    const int32_t pos = stack.back();
    switch (e.g.kind(pos)) {
      case PositionKind::kBytes:
        if (e.next >= 0 && !e.g.bytes(pos).Contains(static_cast<uint8_t>(e.next))) return true;
        return e.out->Add(stack, tag);
      case PositionKind::kEnd:
        if (e.watch != nullptr && tag == StackSet::kNoTag && stack.size() == e.watch->depth + 1) {
          tag = e.watch->NeedOnLeaving(e.g, pos);
        }
        stack.pop_back();
        if (!stack.empty()) ++stack.back();
        continue;
      case PositionKind::kRule: {
        const bool tail = e.g.kind(pos + 1) == PositionKind::kEnd;
        const std::vector<int32_t>& starts = e.g.alternative_starts(e.g.referenced_rule(pos));
        std::vector<int32_t>& branch = Scratch(depth + 1);
        for (const int32_t start : starts) {
          branch.assign(stack.begin(), stack.end() - (tail ? 1 : 0));
          branch.push_back(start);
          if (!Expand(e, branch, depth + 1, tag)) return false;
        }
        return true;
      }
    }
  }
  if (e.escaped != nullptr) {
    *e.escaped = true;
    if (e.watch != nullptr) {
      const uint16_t need = tag == StackSet::kNoTag ? e.watch->anchor : tag;
      e.watch->escape_need = std::min(e.watch->escape_need, need);
    }
    return true;
  }
  if (e.next >= 0) return true;  // complete, yet a byte follows
  return e.out->Add(stack, tag);
}

}  // namespace

// The frame at `depth` only ever holds the watched repetition's positions (Grammar::counted
// validated its rules), so the fallback of both, the anchor itself, is never used; it would only
// narrow.
uint16_t RepeatWatch::NeedOnLeaving(const Grammar& g, int32_t pos) const {
  const CountedPosition at = g.counted(pos);
  if (at.repeat < 0 || at.count > anchor) return static_cast<uint16_t>(anchor);
  return static_cast<uint16_t>(anchor - at.count);
}

uint16_t RepeatWatch::NeedInside(const Grammar& g, int32_t pos) const {
  const CountedPosition at = g.counted(pos);
  if (at.repeat < 0 || at.count < 1 || at.count > anchor) return static_cast<uint16_t>(anchor);
  return static_cast<uint16_t>(anchor - at.count + 1);
}

bool Step(const Grammar& g, const StackSet& in, uint8_t byte, StackSet* out, bool* escaped,
          int next, RepeatWatch* watch) {
  out->Clear();
  if (watch != nullptr) watch->escape_need = RepeatWatch::kNone;
  const Expansion e{g, out, escaped, next, watch};
  std::vector<int32_t>& stack = Scratch(0);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in.begin(i) == in.end(i)) continue;  // complete: nothing may follow on this stack
    const int32_t top = *(in.end(i) - 1);
    if (!g.bytes(top).Contains(byte)) continue;
    stack.assign(in.begin(i), in.end(i));
    ++stack.back();
    if (!Expand(e, stack, 0, in.tag(i))) return false;
  }
  return true;
}

bool CanEnd(const StackSet& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.begin(i) == s.end(i)) return true;
  }
  return false;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)) {
  std::vector<int32_t>& stack = Scratch(0);
  for (const int32_t start : grammar_->alternative_starts(grammar_->root())) {
    stack.assign(1, start);
    Expand({*grammar_, &stacks_, nullptr, -1, nullptr}, stack, 0, StackSet::kNoTag);
  }
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  StackSet before = stacks_;
  for (size_t k = 0; k < bytes.size(); ++k) {
    // Knowing the next byte keeps only the stacks that take it, so an overflow keeps those.
    const int next = k + 1 < bytes.size() ? static_cast<uint8_t>(bytes[k + 1]) : -1;
    // An overflow keeps the first kMaxStacks stacks: it narrows what may follow (as the token
    // mask, which looks at one stack at a time, cannot see), never admits what the grammar
    // refuses.
    Step(*grammar_, stacks_, static_cast<uint8_t>(bytes[k]), &next_, nullptr, next);
    if (next_.empty()) {
      stacks_ = std::move(before);
      return false;
    }
    std::swap(stacks_, next_);
  }
  return true;
}

bool GrammarMatcher::IsComplete() const {
  for (size_t i = 0; i < stacks_.size(); ++i) {
    if (stacks_.begin(i) != stacks_.end(i)) return false;
  }
  return !stacks_.empty();
}

bool GrammarMatcher::Allows(uint8_t byte) const {
  for (size_t i = 0; i < stacks_.size(); ++i) {
    if (stacks_.begin(i) != stacks_.end(i) &&
        grammar_->bytes(*(stacks_.end(i) - 1)).Contains(byte)) {
      return true;
    }
  }
  return false;
}

}  // namespace specula::grammar
