#include "engine/grammar/ebnf.h"

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/common/hex_digits.h"
#include "engine/common/status_macros.h"
#include "engine/grammar/code_points.h"
#include "engine/grammar/regex_emitter.h"
#include "engine/grammar/regex_syntax.h"

namespace specula::grammar {
namespace {

using Kind = RegexNode::Kind;

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxRepeat = 10000;

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9') || c == '-'; }

class EbnfParser {
 public:
  EbnfParser(std::string_view text, GrammarBuilder& b) : t_(text), b_(b) {}

  absl::StatusOr<int32_t> Run() {
    SkipSpace();
    if (AtEnd()) return Error("the grammar has no rules");
    while (!AtEnd()) RETURN_IF_ERROR(Definition());
    for (const auto& [name, at] : used_) {
      if (!defined_.contains(name)) {
        return ErrorAt(at, absl::StrCat("rule '", name, "' is used but not defined"));
      }
    }
    if (!defined_.contains("root")) return Error("no rule is named root (where the text starts)");
    RegexEmitter emit(b_, RegexText::kRaw);
    for (const auto& [rule, body] : definitions_) {
      emit.set_name(b_.rule_name(rule));
      if (body.kind == Kind::kUnion) {
        for (const RegexNode& alternative : body.children) Emit(emit, rule, alternative);
      } else {
        Emit(emit, rule, body);
      }
    }
    return ids_.at("root");
  }

 private:
  bool AtEnd() const { return i_ >= t_.size(); }
  char Peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c || AtEnd()) return false;
    ++i_;
    return true;
  }

  // "line L column C" of byte `at`.
  std::string Where(size_t at) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t k = 0; k < at && k < t_.size(); ++k) {
      if (t_[k] == '\n') {
        ++line;
        line_start = k + 1;
      }
    }
    return absl::StrCat("line ", line, " column ", at - line_start + 1);
  }
  absl::Status Error(absl::string_view what) const { return ErrorAt(i_, what); }
  absl::Status ErrorAt(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("ebnf at ", Where(at), ": ", what));
  }

  void SkipSpace() {
    while (!AtEnd()) {
      if (Peek() == '#') {
        while (!AtEnd() && Peek() != '\n') ++i_;
      } else if (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r') {
        ++i_;
      } else {
        return;
      }
    }
  }

  std::string Name() {
    const size_t start = i_;
    if (!IsNameStart(Peek())) return "";
    while (!AtEnd() && IsNameChar(Peek())) ++i_;
    return std::string(t_.substr(start, i_ - start));
  }

  // Whether a definition (`name ::=`) starts at the cursor.
  bool AtDefinition() {
    const size_t start = i_;
    const bool name = !Name().empty();
    SkipSpace();
    const bool is = name && t_.substr(i_, 3) == "::=";
    i_ = start;
    return is;
  }

  int32_t RuleId(const std::string& name) {
    auto [it, added] = ids_.try_emplace(name, -1);
    if (added) it->second = b_.NewRule(name);
    return it->second;
  }

  absl::Status Definition() {
    const std::string name = Name();
    if (name.empty()) return Error("expected a rule name");
    SkipSpace();
    if (t_.substr(i_, 3) != "::=") return Error(absl::StrCat("expected ::= after '", name, "'"));
    if (defined_.contains(name)) return Error(absl::StrCat("rule '", name, "' is defined twice"));
    i_ += 3;
    defined_.insert(name);
    const int32_t rule = RuleId(name);
    ASSIGN_OR_RETURN(RegexNode body, Alternatives(0));
    if (!AtEnd() && !AtDefinition()) {
      return Error(Peek() == ')' ? "unmatched )" : "expected | or a new rule");
    }
    definitions_.push_back({rule, std::move(body)});
    return absl::OkStatus();
  }

  absl::StatusOr<RegexNode> Alternatives(int depth) {
    RegexNode alt;
    alt.kind = Kind::kUnion;
    do {
      ASSIGN_OR_RETURN(RegexNode seq, Sequence(depth));
      alt.children.push_back(std::move(seq));
    } while (Eat('|'));
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<RegexNode> Sequence(int depth) {
    RegexNode seq;
    seq.kind = Kind::kConcat;
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')' || AtDefinition()) break;
      ASSIGN_OR_RETURN(RegexNode item, Primary(depth));
      ASSIGN_OR_RETURN(item, Quantified(std::move(item)));
      seq.children.push_back(std::move(item));
    }
    SkipSpace();
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  absl::StatusOr<RegexNode> Primary(int depth) {
    if (depth >= kMaxDepth) return Error(absl::StrCat("nested deeper than ", kMaxDepth));
    if (Eat('"')) return String();
    if (Eat('[')) return Class();
    if (Eat('.')) return CharsNode(CodePointSet::All());
    if (Eat('(')) {
      ASSIGN_OR_RETURN(RegexNode inner, Alternatives(depth + 1));
      if (!Eat(')')) return Error("missing )");
      return inner;
    }
    const size_t at = i_;
    const std::string name = Name();
    if (name.empty()) return Error("expected a string, a class, a rule name or (");
    used_.try_emplace(name, at);
    RegexNode ref;
    ref.kind = Kind::kRef;
    ref.rule = RuleId(name);
    return ref;
  }

  absl::StatusOr<RegexNode> Quantified(RegexNode item) {
    SkipSpace();
    int64_t min, max;
    if (const auto simple = SimpleQuantifier(Peek()); simple && !AtEnd()) {
      ++i_;
      std::tie(min, max) = *simple;
    } else if (Eat('{')) {
      ASSIGN_OR_RETURN(min, Count());
      max = min;
      if (Eat(',')) {
        max = -1;
        if (Peek() != '}') {
          ASSIGN_OR_RETURN(max, Count());
        }
      }
      if (!Eat('}')) return Error("expected } closing {m,n}");
      if (max >= 0 && min > max) return Error("{m,n} with m > n");
    } else {
      return item;
    }
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{') {
      return Error("a quantifier after a quantifier (group the item)");
    }
    return RepeatNode(std::move(item), min, max);
  }

  absl::StatusOr<int64_t> Count() {
    int64_t v = 0;
    const size_t start = i_;
    while (Peek() >= '0' && Peek() <= '9' && !AtEnd()) {
      v = v * 10 + (t_[i_++] - '0');
      if (v > kMaxRepeat) return Error(absl::StrCat("a repetition bound over ", kMaxRepeat));
    }
    if (i_ == start) return Error("expected a number in {m,n}");
    return v;
  }

  absl::StatusOr<RegexNode> String() {
    RegexNode seq;
    seq.kind = Kind::kConcat;
    while (!Eat('"')) {
      if (AtEnd() || Peek() == '\n') return Error("unterminated string");
      ASSIGN_OR_RETURN(const uint32_t c, Char());
      seq.children.push_back(CharsNode(CodePointSet::Of(c, c)));
    }
    return seq;  // "" is the empty text
  }

  absl::StatusOr<RegexNode> Class() {
    const bool negated = Eat('^');
    CodePointSet set;
    while (!Eat(']')) {
      if (AtEnd()) return Error("missing ]");
      ASSIGN_OR_RETURN(const uint32_t lo, Char());
      uint32_t hi = lo;
      if (Peek() == '-' && i_ + 1 < t_.size() && t_[i_ + 1] != ']') {
        ++i_;
        ASSIGN_OR_RETURN(hi, Char());
        if (hi < lo) return Error("a range out of order");
      }
      set.Add(lo, hi);
    }
    if (negated) set = set.Complement();
    if (set.empty()) return Error("a class no character satisfies");
    return CharsNode(std::move(set));
  }

  // One character of a string or class: UTF-8 text or an escape.
  absl::StatusOr<uint32_t> Char() {
    if (!Eat('\\')) {
      std::optional<uint32_t> c = DecodeUtf8(t_, &i_);
      if (!c) return Error("invalid UTF-8");
      return *c;
    }
    if (AtEnd()) return Error("\\ at the end");
    const char e = t_[i_++];
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
        return static_cast<uint32_t>(e);
      case 'x':
        return Hex(2);
      case 'u':
        return Hex(4);
      case 'U':
        return Hex(8);
      default:
        --i_;
        if (static_cast<unsigned char>(e) >= 0x80) return Error("an escaped non-ASCII character");
        return Error(absl::StrCat("unknown escape \\", std::string(1, e)));
    }
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    const std::optional<uint32_t> v = ReadHexDigits(t_, &i_, digits);
    if (!v) return Error(absl::StrCat("expected ", digits, " hex digits"));
    if (*v > kMaxCodePoint || (*v >= 0xD800 && *v <= 0xDFFF)) {
      return Error("not a Unicode scalar value");
    }
    return *v;
  }

  void Emit(RegexEmitter& emit, int32_t rule, const RegexNode& alternative) {
    Alternative a;
    emit.Append(alternative, a);
    b_.AddAlternative(rule, std::move(a));
  }

  std::string_view t_;
  GrammarBuilder& b_;
  size_t i_ = 0;
  absl::flat_hash_map<std::string, int32_t> ids_;
  absl::flat_hash_set<std::string> defined_;
  absl::flat_hash_map<std::string, size_t> used_;  // name -> offset of its first use
  std::vector<std::pair<int32_t, RegexNode>> definitions_;
};

}  // namespace

absl::StatusOr<int32_t> AddEbnf(std::string_view text, GrammarBuilder& b) {
  return EbnfParser(text, b).Run();
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileEbnf(std::string_view text,
                                                           int64_t max_symbols) {
  GrammarBuilder b(max_symbols);
  ASSIGN_OR_RETURN(const int32_t root, AddEbnf(text, b));
  ASSIGN_OR_RETURN(Grammar g, b.Build(root));
  return std::make_shared<const Grammar>(std::move(g));
}

}  // namespace specula::grammar
