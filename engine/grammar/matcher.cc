#include "engine/grammar/matcher.h"

#include <algorithm>
#include <utility>

namespace specula::grammar {

void StackSet::Clear() {
  frames_.clear();
  offsets_.resize(1);
}

bool StackSet::Contains(const std::vector<int32_t>& stack) const {
  for (size_t i = 0; i < size(); ++i) {
    if (std::equal(begin(i), end(i), stack.begin(), stack.end())) return true;
  }
  return false;
}

bool StackSet::Add(const std::vector<int32_t>& stack) {
  if (Contains(stack)) return true;
  if (size() >= kMaxStacks) return false;
  frames_.insert(frames_.end(), stack.begin(), stack.end());
  offsets_.push_back(static_cast<uint32_t>(frames_.size()));
  return true;
}

namespace {

// Adds to `out` every stack `stack` stands for once its top is a byte symbol (or it is empty):
// an alternative's end returns to the referring position's successor, a rule reference opens
// each alternative. `stack` is scratch. False when `out` overflowed.
bool Expand(const Grammar& g, std::vector<int32_t>& stack, StackSet* out) {
  while (!stack.empty()) {
    const int32_t pos = stack.back();
    switch (g.kind(pos)) {
      case PositionKind::kBytes:
        return out->Add(stack);
      case PositionKind::kEnd:
        stack.pop_back();
        if (!stack.empty()) ++stack.back();
        continue;
      case PositionKind::kRule: {
        for (const int32_t start : g.alternative_starts(g.referenced_rule(pos))) {
          std::vector<int32_t> branch = stack;
          branch.push_back(start);
          if (!Expand(g, branch, out)) return false;
        }
        return true;
      }
    }
  }
  return out->Add(stack);
}

}  // namespace

bool Step(const Grammar& g, const StackSet& in, uint8_t byte, StackSet* out) {
  out->Clear();
  std::vector<int32_t> stack;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in.begin(i) == in.end(i)) continue;  // complete: nothing may follow on this stack
    const int32_t top = *(in.end(i) - 1);
    if (!g.bytes(top).Contains(byte)) continue;
    stack.assign(in.begin(i), in.end(i));
    ++stack.back();
    if (!Expand(g, stack, out)) return false;
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
  std::vector<int32_t> stack;
  for (const int32_t start : grammar_->alternative_starts(grammar_->root())) {
    stack.assign(1, start);
    Expand(*grammar_, stack, &stacks_);
  }
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  StackSet before = stacks_;
  for (const char c : bytes) {
    if (!Step(*grammar_, stacks_, static_cast<uint8_t>(c), &next_) || next_.empty()) {
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
