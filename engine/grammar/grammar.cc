#include "engine/grammar/grammar.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace specula::grammar {

ByteSet ByteSet::Range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.Add(lo, hi);
  return s;
}

ByteSet ByteSet::Of(std::string_view bytes) {
  ByteSet s;
  for (const char c : bytes) s.Add(static_cast<uint8_t>(c), static_cast<uint8_t>(c));
  return s;
}

void ByteSet::Add(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) words_[b >> 6] |= uint64_t{1} << (b & 63);
}

ByteSet& ByteSet::operator|=(const ByteSet& other) {
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
  return *this;
}

int32_t GrammarBuilder::NewRule(std::string name) {
  rules_.push_back(Rule{std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::AddAlternative(int32_t rule, Alternative alternative) {
  symbols_ += static_cast<int64_t>(alternative.size()) + 1;
  rules_[rule].alternatives.push_back(std::move(alternative));
}

int32_t GrammarBuilder::AddRule(std::string name, std::vector<Alternative> alternatives) {
  const int32_t rule = NewRule(std::move(name));
  for (Alternative& a : alternatives) AddAlternative(rule, std::move(a));
  return rule;
}

Alternative GrammarBuilder::Literal(std::string_view text) {
  Alternative a;
  a.reserve(text.size());
  for (const char c : text) a.push_back(Bytes(ByteSet::Of(std::string_view(&c, 1))));
  return a;
}

int32_t GrammarBuilder::Repeat(std::string name, int32_t body, int64_t min, int64_t max) {
  // The optional part: with no bound, tail ::= body tail | ""; with k more allowed,
  // tail_k ::= body tail_{k-1} | "" down to tail_0 ::= "".
  int32_t tail;
  if (max < 0) {
    tail = NewRule(name + "_more");
    AddAlternative(tail, {Ref(body), Ref(tail)});
    AddAlternative(tail, {});
  } else {
    tail = AddRule(name + "_end", {{}});
    BoundedRepeat repeat{body, {tail}};
    for (int64_t k = min; k < max && symbols_ <= max_symbols_; ++k) {
      tail = AddRule(absl::StrCat(name, "_upto", max - k), {{Ref(body), Ref(tail)}, {}});
      repeat.tails.push_back(tail);
    }
    if (repeat.tails.size() > 1) repeats_.push_back(std::move(repeat));
  }
  Alternative required;
  for (int64_t i = 0; i < min && symbols_ + i <= max_symbols_; ++i) required.push_back(Ref(body));
  required.push_back(Ref(tail));
  return AddRule(std::move(name), {std::move(required)});
}

absl::Status GrammarBuilder::CheckBudget() const {
  if (symbols_ > max_symbols_) {
    return absl::InvalidArgumentError(absl::StrCat("the grammar needs more than ", max_symbols_,
                                                   " symbols; simplify the schema"));
  }
  return absl::OkStatus();
}

namespace {

// Which rules have an alternative made only of symbols that `holds` (bytes: `bytes_hold`; rules:
// already found), to a fixpoint: nullable rules with bytes_hold = false, productive ones with
// true. A worklist: each alternative counts its symbols not known to hold.
std::vector<bool> RulesWithAnAlternativeThatHolds(const std::vector<Rule>& rules, bool bytes_hold) {
  struct Alt {
    int32_t rule;
    int64_t missing = 0;
  };
  std::vector<Alt> alts;
  std::vector<std::vector<int64_t>> uses(rules.size());  // rule -> alternatives referring to it
  std::vector<bool> holds(rules.size(), false);
  std::vector<int32_t> ready;
  for (size_t r = 0; r < rules.size(); ++r) {
    for (const Alternative& a : rules[r].alternatives) {
      Alt alt{static_cast<int32_t>(r)};
      for (const Symbol& s : a) {
        if (s.rule >= 0) {
          ++alt.missing;
          uses[s.rule].push_back(static_cast<int64_t>(alts.size()));
        } else if (!bytes_hold || s.bytes.empty()) {
          alt.missing = -1;  // never holds
          break;
        }
      }
      if (alt.missing == 0) ready.push_back(alt.rule);
      alts.push_back(alt);
    }
  }
  while (!ready.empty()) {
    const int32_t r = ready.back();
    ready.pop_back();
    if (holds[r]) continue;
    holds[r] = true;
    for (const int64_t a : uses[r]) {
      if (alts[a].missing > 0 && --alts[a].missing == 0) ready.push_back(alts[a].rule);
    }
  }
  return holds;
}

// A rule that reaches itself through leftmost references (each after only nullable symbols),
// or -1; without one, `order` lists every rule after those it refers to leftmost. Iterative
// depth-first search: Repeat's chains can be long.
int32_t FindLeftRecursion(const std::vector<Rule>& rules, const std::vector<bool>& nullable,
                          std::vector<int32_t>* order) {
  std::vector<std::vector<int32_t>> leftmost(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    for (const Alternative& a : rules[r].alternatives) {
      for (const Symbol& s : a) {
        if (s.rule < 0) break;
        leftmost[r].push_back(s.rule);
        if (!nullable[s.rule]) break;
      }
    }
  }
  enum : uint8_t { kNew, kOpen, kDone };
  std::vector<uint8_t> state(rules.size(), kNew);
  std::vector<std::pair<int32_t, size_t>> stack;
  for (size_t start = 0; start < rules.size(); ++start) {
    if (state[start] != kNew) continue;
    stack.push_back({static_cast<int32_t>(start), 0});
    state[start] = kOpen;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next == leftmost[r].size()) {
        state[r] = kDone;
        order->push_back(r);
        stack.pop_back();
        continue;
      }
      const int32_t s = leftmost[r][next++];
      if (state[s] == kOpen) return s;
      if (state[s] == kNew) {
        state[s] = kOpen;
        stack.push_back({s, 0});
      }
    }
  }
  return -1;
}

// The most rules the matcher may expand before its next byte, from entering each rule: its
// expansion recurses once per rule, so a grammar past this (nested repetitions of what can be
// empty: `((a?){1000}){1000}`) would cost time per byte and stack past any bound.
constexpr int64_t kMaxExpansions = 2048;

// The first rule (in `order`: leftmost references first) from which more than kMaxExpansions
// rules may be expanded without a byte, or -1. Per rule, `empty`: the most expansions that derive
// nothing from it (nullable rules); `first`: the most before its first byte.
int32_t FindDeepExpansion(const std::vector<Rule>& rules, const std::vector<bool>& nullable,
                          const std::vector<int32_t>& order) {
  constexpr int64_t kCap = kMaxExpansions + 1;  // saturate: sums can grow exponentially
  std::vector<int64_t> empty(rules.size(), 0), first(rules.size(), 0);
  for (const int32_t r : order) {
    int64_t most_empty = 0, most_first = 0;
    for (const Alternative& a : rules[r].alternatives) {
      int64_t before = 0;  // expansions deriving nothing from the symbols so far
      bool all_empty = true;
      for (const Symbol& s : a) {
        const bool can_be_empty = s.rule >= 0 && nullable[s.rule];
        most_first =
            std::max(most_first, std::min(kCap, before + (s.rule >= 0 ? first[s.rule] : 0)));
        if (!can_be_empty) {
          all_empty = false;
          break;
        }
        before = std::min(kCap, before + empty[s.rule]);
      }
      if (all_empty) most_empty = std::max(most_empty, before);
    }
    empty[r] = std::min(kCap, 1 + most_empty);
    first[r] = std::min(kCap, 1 + most_first);
    if (first[r] > kMaxExpansions || empty[r] > kMaxExpansions) return r;
  }
  return -1;
}

// Removes every alternative holding a symbol that can never be completed (a rule that derives no
// finite string, an empty byte set): the matcher could enter it and never end, e.g. a required
// property whose schema refers to itself. Every rule left then derives some string (productive
// ones keep an alternative; the others are no longer referred to).
void DropAlternativesThatCannotEnd(const std::vector<bool>& productive, std::vector<Rule>& rules) {
  for (Rule& rule : rules) {
    std::erase_if(rule.alternatives, [&](const Alternative& a) {
      return std::any_of(a.begin(), a.end(), [&](const Symbol& s) {
        return s.rule >= 0 ? !productive[s.rule] : s.bytes.empty();
      });
    });
  }
}

// Removes a rule's repeated alternatives (`a||b`, `(x|x)*`): each would be one more parse stack
// at every step, for nothing.
void DropRepeatedAlternatives(std::vector<Rule>& rules) {
  for (Rule& rule : rules) {
    if (rule.alternatives.size() < 2) continue;
    absl::flat_hash_set<std::string> seen;
    std::erase_if(rule.alternatives, [&seen](const Alternative& a) {
      std::string key;
      for (const Symbol& s : a) {
        key.append(reinterpret_cast<const char*>(&s.rule), sizeof(s.rule));
        key.append(reinterpret_cast<const char*>(s.bytes.words().data()),
                   sizeof(uint64_t) * s.bytes.words().size());
      }
      return !seen.insert(std::move(key)).second;
    });
  }
}

}  // namespace

void GrammarBuilder::RecordBoundedRepeats(const std::vector<bool>& nullable, Grammar& g) const {
  const auto is_ref = [](const Symbol& s, int32_t rule) { return s.rule == rule; };
  for (const BoundedRepeat& repeat : repeats_) {
    if (nullable[repeat.body]) continue;
    const std::vector<Alternative>& last = rules_[repeat.tails[0]].alternatives;
    bool kept = last.size() == 1 && last[0].empty();
    for (size_t k = 1; k < repeat.tails.size() && kept; ++k) {
      const std::vector<Alternative>& alts = rules_[repeat.tails[k]].alternatives;
      kept = alts.size() == 2 && alts[0].size() == 2 && is_ref(alts[0][0], repeat.body) &&
             is_ref(alts[0][1], repeat.tails[k - 1]) && alts[1].empty();
    }
    if (!kept) continue;
    if (g.counted_.empty()) g.counted_.resize(g.kind_.size());
    const auto id = static_cast<int32_t>(g.body_refs_.size());
    std::vector<int32_t>& refs = g.body_refs_.emplace_back();
    for (size_t k = 0; k < repeat.tails.size(); ++k) {
      const std::vector<int32_t>& starts = g.starts_[repeat.tails[k]];
      const auto count = static_cast<int32_t>(k);
      g.counted_[starts.back()] = {id, count};  // the empty alternative's end
      if (k == 0) continue;
      g.counted_[starts[0]] = {id, count};
      refs.push_back(starts[0]);
    }
  }
}

absl::StatusOr<Grammar> GrammarBuilder::Build(int32_t root) {
  if (absl::Status s = CheckBudget(); !s.ok()) return s;
  if (root < 0 || root >= static_cast<int32_t>(rules_.size())) {
    return absl::InvalidArgumentError("grammar: no root rule");
  }
  for (const Rule& rule : rules_) {
    if (rule.alternatives.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: rule '", rule.name, "' is empty"));
    }
    for (const Alternative& a : rule.alternatives) {
      for (const Symbol& s : a) {
        if (s.rule >= static_cast<int32_t>(rules_.size())) {
          return absl::InvalidArgumentError(
              absl::StrCat("grammar: rule '", rule.name, "' refers to no rule"));
        }
      }
    }
  }
  const std::vector<bool> productive = RulesWithAnAlternativeThatHolds(rules_, /*bytes_hold=*/true);
  if (!productive[root]) return absl::InvalidArgumentError("no output can satisfy the constraint");
  DropAlternativesThatCannotEnd(productive, rules_);
  DropRepeatedAlternatives(rules_);
  const std::vector<bool> nullable = RulesWithAnAlternativeThatHolds(rules_, false);
  std::vector<int32_t> order;
  if (const int32_t r = FindLeftRecursion(rules_, nullable, &order); r >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: rule '", rules_[r].name, "' is left-recursive"));
  }
  if (const int32_t r = FindDeepExpansion(rules_, nullable, order); r >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar: rule '", rules_[r].name, "' may nest more than ", kMaxExpansions,
        " rules before a byte (repetitions of what can be empty, nested; simplify them)"));
  }
  Grammar g;
  g.root_ = root;
  g.starts_.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Alternative& a : rules_[r].alternatives) {
      g.starts_[r].push_back(static_cast<int32_t>(g.kind_.size()));
      for (const Symbol& s : a) {
        g.kind_.push_back(s.rule >= 0 ? PositionKind::kRule : PositionKind::kBytes);
        g.bytes_.push_back(s.bytes);
        g.ref_.push_back(s.rule);
      }
      g.kind_.push_back(PositionKind::kEnd);
      g.bytes_.push_back({});
      g.ref_.push_back(-1);
    }
  }
  RecordBoundedRepeats(nullable, g);
  g.rules_ = std::move(rules_);
  rules_.clear();
  repeats_.clear();
  symbols_ = 0;
  return g;
}

}  // namespace specula::grammar
