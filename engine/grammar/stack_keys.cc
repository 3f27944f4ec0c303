#include "engine/grammar/stack_keys.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace specula::grammar {
namespace {

// What can lie below a frame of each rule.
class Callers {
 public:
  struct Below {
    std::vector<int32_t> frames;  // distinct, in the order met
    bool bottom = false;
  };

  explicit Callers(const Grammar& g);
  int32_t rule_of(int32_t pos) const { return rule_of_[static_cast<size_t>(pos)]; }
  // Memoized: the rules that reach `rule` by tail calls, and their references that are not.
  const Below& Of(int32_t rule);

 private:
  const Grammar& g_;
  std::vector<int32_t> rule_of_;
  std::vector<std::vector<int32_t>> direct_;     // by rule: references to it that keep a frame
  std::vector<std::vector<int32_t>> tail_from_;  // by rule: rules that end by calling it
  absl::flat_hash_map<int32_t, Below> memo_;
};

Callers::Callers(const Grammar& g) : g_(g) {
  const size_t rules = g.rules().size();
  rule_of_.assign(static_cast<size_t>(g.num_positions()), -1);
  direct_.resize(rules);
  tail_from_.resize(rules);
  for (size_t r = 0; r < rules; ++r) {
    for (int32_t p : g.alternative_starts(static_cast<int32_t>(r))) {
      for (;; ++p) {
        rule_of_[static_cast<size_t>(p)] = static_cast<int32_t>(r);
        if (g.kind(p) == PositionKind::kEnd) break;
      }
    }
  }
  for (int32_t p = 0; p < g.num_positions(); ++p) {
    if (g.kind(p) != PositionKind::kRule) continue;
    const auto callee = static_cast<size_t>(g.referenced_rule(p));
    if (g.kind(p + 1) == PositionKind::kEnd) {
      tail_from_[callee].push_back(rule_of(p));
    } else {
      direct_[callee].push_back(p);
    }
  }
}

const Callers::Below& Callers::Of(int32_t rule) {
  if (auto it = memo_.find(rule); it != memo_.end()) return it->second;
  Below below;
  absl::flat_hash_set<int32_t> rules{rule}, frames;
  std::vector<int32_t> pending{rule};
  while (!pending.empty()) {
    const int32_t r = pending.back();
    pending.pop_back();
    below.bottom |= r == g_.root();
    for (const int32_t f : direct_[static_cast<size_t>(r)]) {
      if (frames.insert(f).second) below.frames.push_back(f);
    }
    for (const int32_t caller : tail_from_[static_cast<size_t>(r)]) {
      if (rules.insert(caller).second) pending.push_back(caller);
    }
  }
  return memo_.emplace(rule, std::move(below)).first->second;
}

class KeyFinder {
 public:
  KeyFinder(const Grammar& g, size_t frames, absl::FunctionRef<int32_t(int32_t)> anchor,
            size_t max_keys)
      : g_(g), callers_(g), frames_(frames), anchor_(anchor), max_keys_(max_keys) {}

  // Every key whose frames from the top down start with `suffix`.
  void Extend(std::vector<int32_t>& suffix) {
    if (keys_.size() >= max_keys_ || ++visits_ > kMaxVisits) return;
    // A copy: the recursion below adds to the memo, which may move what a reference points to.
    const Callers::Below below = callers_.Of(callers_.rule_of(suffix.back()));
    if (below.bottom) Emit(suffix, /*whole=*/true);
    if (suffix.size() == frames_) {
      if (!below.frames.empty()) Emit(suffix, /*whole=*/false);
      return;
    }
    for (const int32_t f : below.frames) {
      const CountedPosition at = g_.counted(f);
      if (at.repeat >= 0 && at.count != anchor_(at.repeat)) continue;
      suffix.push_back(f);
      Extend(suffix);
      suffix.pop_back();
    }
  }

  std::vector<StackKey> Take() { return std::move(keys_); }

 private:
  void Emit(const std::vector<int32_t>& suffix, bool whole) {
    if (keys_.size() >= max_keys_) return;
    StackKey key{std::vector<int32_t>(suffix.rbegin(), suffix.rend()), whole};
    std::vector<int32_t> id = key.frames;
    id.push_back(whole ? -1 : -2);
    if (seen_.insert(std::move(id)).second) keys_.push_back(std::move(key));
  }

  const Grammar& g_;
  Callers callers_;
  const size_t frames_;
  absl::FunctionRef<int32_t(int32_t)> anchor_;
  const size_t max_keys_;
  absl::flat_hash_set<std::vector<int32_t>> seen_;
  std::vector<StackKey> keys_;
  // Suffixes extended: a rule referred to from many places, each in a rule referred to from many,
  // multiplies them, and most give keys already found.
  static constexpr size_t kMaxVisits = size_t{1} << 16;
  size_t visits_ = 0;
};

}  // namespace

std::vector<StackKey> StackKeys(const Grammar& g, size_t frames, const std::vector<int32_t>& tops,
                                absl::FunctionRef<int32_t(int32_t)> anchor, size_t max_keys) {
  KeyFinder finder(g, std::max<size_t>(1, frames), anchor, max_keys);
  std::vector<int32_t> suffix;  // top first
  for (const int32_t top : tops) {
    if (g.kind(top) != PositionKind::kBytes) continue;
    suffix.assign(1, top);
    finder.Extend(suffix);
  }
  return finder.Take();
}

}  // namespace specula::grammar
