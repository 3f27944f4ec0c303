#include "engine/grammar/regex_emitter.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;
using Kind = RegexNode::Kind;

// The escape JSON writes for code point `c` in a string: \" \\ \b \f \n \r \t or \u00XX.
std::string JsonEscape(uint32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      return absl::StrFormat("\\u%04x", c);
  }
}

// The code points JSON must escape inside a string.
const CodePointSet& JsonEscaped() {
  static const CodePointSet* const kSet = [] {
    auto* s = new CodePointSet(CodePointSet::Of(0, 0x1F));
    s->Add('"', '"');
    s->Add('\\', '\\');
    return s;
  }();
  return *kSet;
}

}  // namespace

int32_t RegexEmitter::RuleFor(const RegexNode& n) {
  if (auto it = rules_.find(&n); it != rules_.end()) return it->second;
  int32_t rule;
  switch (n.kind) {
    case Kind::kChars:
      rule = CharsRule(n.chars);
      break;
    case Kind::kRef:
      return n.rule;
    case Kind::kRepeat:
      rule = RepeatRule(n.children[0], n.min, n.max);
      break;
    case Kind::kUnion:
      rule = b_.NewRule(Name("_union"));
      for (const RegexNode& c : n.children) {
        Alternative a;
        Append(c, a);
        b_.AddAlternative(rule, std::move(a));
      }
      break;
    default: {  // kEmpty, kConcat
      Alternative a;
      Append(n, a);
      rule = b_.AddRule(Name("_seq"), {std::move(a)});
    }
  }
  rules_[&n] = rule;
  return rule;
}

void RegexEmitter::Append(const RegexNode& n, Alternative& out) {
  switch (n.kind) {
    case Kind::kEmpty:
      return;
    case Kind::kConcat:
      for (const RegexNode& c : n.children) Append(c, out);
      return;
    case Kind::kRef:
      out.push_back(B::Ref(n.rule));
      return;
    case Kind::kChars:
      if (std::optional<ByteSet> bytes = SingleBytes(n.chars)) {
        out.push_back(B::Bytes(*bytes));
        return;
      }
      [[fallthrough]];
    default:
      out.push_back(B::Ref(RuleFor(n)));
  }
}

int32_t RegexEmitter::AnyText() {
  if (!any_text_) any_text_ = b_.Repeat(Name("_any"), CharsRule(CodePointSet::All()), 0, -1);
  return *any_text_;
}

// The byte set of `chars` when each is written as one byte; nullopt otherwise.
std::optional<ByteSet> RegexEmitter::SingleBytes(const CodePointSet& chars) const {
  ByteSet bytes;
  for (const auto& [lo, hi] : chars.ranges()) {
    if (hi >= 0x80) return std::nullopt;
    bytes.Add(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
  }
  if (text_ == RegexText::kJsonString && !chars.Intersect(JsonEscaped()).empty()) {
    return std::nullopt;
  }
  return bytes;
}

int32_t RegexEmitter::CharsRule(const CodePointSet& chars) {
  if (auto it = char_rules_.find(chars.ranges()); it != char_rules_.end()) return it->second;
  CodePointSet plain = chars;
  std::vector<Alternative> alternatives;
  if (text_ == RegexText::kJsonString) {
    plain = chars.Minus(JsonEscaped());
    const CodePointSet escaped = chars.Intersect(JsonEscaped());
    for (const auto& [lo, hi] : escaped.ranges()) {
      for (uint32_t c = lo; c <= hi; ++c) alternatives.push_back(B::Literal(JsonEscape(c)));
    }
  }
  ByteSet ascii;
  for (const auto& [lo, hi] : plain.ranges()) {
    for (const Utf8Sequence& seq : Utf8Sequences(lo, hi)) {
      if (seq.size() == 1) {
        ascii.Add(seq[0].first, seq[0].second);
        continue;
      }
      Alternative a;
      for (const auto& [first, last] : seq) a.push_back(B::Bytes(ByteSet::Range(first, last)));
      alternatives.push_back(std::move(a));
    }
  }
  if (!ascii.empty()) alternatives.push_back({B::Bytes(ascii)});
  const int32_t rule = b_.AddRule(Name("_chars"), std::move(alternatives));
  char_rules_[chars.ranges()] = rule;
  return rule;
}

int32_t RegexEmitter::RepeatRule(const RegexNode& x, int64_t min, int64_t max) {
  if (max >= 0 || !Nullable(x)) return b_.Repeat(Name("_repeat"), RuleFor(x), min, max);
  const int32_t required = b_.Repeat(Name("_repeat"), RuleFor(x), min, min);
  const std::optional<int32_t> non_empty = NonEmptyRule(x);
  if (!non_empty) return required;
  const int32_t more = b_.Repeat(Name("_repeat"), *non_empty, 0, -1);
  return b_.AddRule(Name("_repeat"), {{B::Ref(required), B::Ref(more)}});
}

std::optional<int32_t> RegexEmitter::NonEmptyRule(const RegexNode& n) {
  // Kept per node: a repetition asks for its child's both directly and through RepeatRule, which
  // would double the work at each level of nesting.
  if (auto it = non_empty_.find(&n); it != non_empty_.end()) return it->second;
  const std::optional<int32_t> rule = MakeNonEmptyRule(n);
  non_empty_[&n] = rule;
  return rule;
}

std::optional<int32_t> RegexEmitter::MakeNonEmptyRule(const RegexNode& n) {
  switch (n.kind) {
    case Kind::kEmpty:
      return std::nullopt;
    case Kind::kChars:
    case Kind::kRef:  // taken as not empty (Nullable)
      return RuleFor(n);
    case Kind::kUnion: {
      std::vector<Alternative> alternatives;
      for (const RegexNode& c : n.children) {
        if (std::optional<int32_t> r = NonEmptyRule(c)) alternatives.push_back({B::Ref(*r)});
      }
      if (alternatives.empty()) return std::nullopt;
      return b_.AddRule(Name("_nonempty"), std::move(alternatives));
    }
    case Kind::kConcat: {
      // The first child that is not empty starts the text; those before it matched "".
      std::vector<Alternative> alternatives;
      for (size_t i = 0; i < n.children.size(); ++i) {
        if (std::optional<int32_t> r = NonEmptyRule(n.children[i])) {
          Alternative a = {B::Ref(*r)};
          for (size_t j = i + 1; j < n.children.size(); ++j) Append(n.children[j], a);
          alternatives.push_back(std::move(a));
        }
        if (!Nullable(n.children[i])) break;
      }
      if (alternatives.empty()) return std::nullopt;
      return b_.AddRule(Name("_nonempty"), std::move(alternatives));
    }
    case Kind::kRepeat: {
      if (n.max == 0) return std::nullopt;
      const std::optional<int32_t> first = NonEmptyRule(n.children[0]);
      if (!first) return std::nullopt;
      const int32_t rest =
          RepeatRule(n.children[0], std::max<int64_t>(n.min - 1, 0), n.max < 0 ? -1 : n.max - 1);
      return b_.AddRule(Name("_nonempty"), {{B::Ref(*first), B::Ref(rest)}});
    }
  }
  return std::nullopt;
}
}  // namespace specula::grammar
