#include "engine/grammar/regex_syntax.h"

#include <cctype>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/hex_digits.h"
#include "engine/common/status_macros.h"

namespace specula::grammar {
namespace {

using Kind = RegexNode::Kind;

CodePointSet Digits() { return CodePointSet::Of('0', '9'); }

CodePointSet WordChars() {
  CodePointSet s = CodePointSet::Of('a', 'z');
  s.Add('A', 'Z');
  s.Add('0', '9');
  s.Add('_', '_');
  return s;
}

// ECMAScript's WhiteSpace and LineTerminator code points.
CodePointSet Spaces() {
  CodePointSet s = CodePointSet::Of('\t', '\r');  // \t \n \v \f \r
  for (uint32_t c : {0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) {
    s.Add(c, c);
  }
  s.Add(0x2000, 0x200A);
  return s;
}

// What `.` matches: everything but the line terminators.
CodePointSet Dot() {
  CodePointSet terminators = CodePointSet::Of('\n', '\n');
  terminators.Add('\r', '\r');
  terminators.Add(0x2028, 0x2029);
  return terminators.Complement();
}

class Parser {
 public:
  Parser(std::string_view pattern, const RegexLimits& limits) : p_(pattern), limits_(limits) {}

  absl::StatusOr<std::vector<RegexBranch>> Run() {
    if (p_.size() > limits_.max_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("regex longer than ", limits_.max_length, " bytes"));
    }
    std::vector<RegexBranch> branches;
    while (true) {
      RegexBranch branch;
      branch.anchored_start = Eat('^');
      ASSIGN_OR_RETURN(branch.node, Alternative(/*depth=*/0, /*top=*/true));
      branch.anchored_end = Eat('$');
      branches.push_back(std::move(branch));
      if (AtEnd()) return branches;
      if (!Eat('|')) return Error(Peek() == ')' ? "unmatched )" : "$ before the end");
    }
  }

 private:
  bool AtEnd() const { return i_ >= p_.size(); }
  char Peek(size_t ahead = 0) const { return i_ + ahead < p_.size() ? p_[i_ + ahead] : '\0'; }
  bool Eat(char c) {
    if (AtEnd() || p_[i_] != c) return false;
    ++i_;
    return true;
  }
  bool EatPrefix(std::string_view s) {
    if (p_.substr(i_, s.size()) != s) return false;
    i_ += s.size();
    return true;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex at offset ", i_, ": ", what));
  }
  // At the start of the atom being parsed: the construct refused.
  absl::Status Unsupported(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex at offset ", atom_start_, ": ", what, " not supported"));
  }

  // Terms up to `|`, `)` or the end (at top level also a final `$`).
  absl::StatusOr<RegexNode> Alternative(int depth, bool top) {
    RegexNode seq;
    seq.kind = Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      atom_start_ = i_;
      if (Peek() == '$') {
        if (top && (i_ + 1 == p_.size() || Peek(1) == '|')) break;
        return Unsupported(
            "$ other than at the end of the pattern or of a top-level alternative is");
      }
      if (Peek() == '^') {
        return Unsupported(
            "^ other than at the start of the pattern or of a top-level alternative is");
      }
      ASSIGN_OR_RETURN(RegexNode atom, Atom(depth));
      ASSIGN_OR_RETURN(atom, Quantified(std::move(atom)));
      seq.children.push_back(std::move(atom));
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    if (seq.children.empty()) return RegexNode{};
    return seq;
  }

  absl::StatusOr<RegexNode> Disjunction(int depth) {
    RegexNode alt;
    alt.kind = Kind::kUnion;
    do {
      ASSIGN_OR_RETURN(RegexNode a, Alternative(depth, /*top=*/false));
      alt.children.push_back(std::move(a));
    } while (Eat('|'));
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<RegexNode> Atom(int depth) {
    if (depth >= limits_.max_depth) {
      return Error(absl::StrCat("nested deeper than ", limits_.max_depth));
    }
    if (Eat('(')) return Group(depth);
    if (Eat('[')) return Class();
    if (Eat('.')) return CharsNode(Dot());
    if (Peek() == '*' || Peek() == '+' || Peek() == '?') return Error("nothing to repeat");
    if (Peek() == '{' && QuantifierBounds().has_value()) return Error("nothing to repeat");
    // The "u" flag's syntax (what ajv and JavaScript validators of `pattern` use): a brace or
    // bracket that opens or closes nothing is an error, not a literal.
    if (Peek() == '{' || Peek() == '}' || Peek() == ']') {
      return Error(absl::StrCat("a lone ", std::string(1, Peek()), " (escape it)"));
    }
    if (Eat('\\')) return Escape();
    ASSIGN_OR_RETURN(const uint32_t c, CodePoint());
    return CharsNode(CodePointSet::Of(c, c));
  }

  absl::StatusOr<RegexNode> Group(int depth) {
    if (EatPrefix("?=") || EatPrefix("?!") || EatPrefix("?<=") || EatPrefix("?<!")) {
      return Unsupported("lookahead and lookbehind are");
    }
    if (EatPrefix("?<")) {  // a named group: the name does not change what matches
      const size_t name = i_;
      while (!AtEnd() &&
             (std::isalnum(static_cast<unsigned char>(Peek())) || Peek() == '_' || Peek() == '$')) {
        ++i_;
      }
      if (i_ == name || std::isdigit(static_cast<unsigned char>(p_[name])) || !Eat('>')) {
        return Error("a malformed group name");
      }
    } else if (!EatPrefix("?:") && Peek() == '?') {
      return Unsupported("this group syntax (? is");
    }
    ASSIGN_OR_RETURN(RegexNode inner, Disjunction(depth + 1));
    if (!Eat(')')) return Error("missing )");
    return inner;
  }

  // {n}, {n,}, {n,m} at the cursor, without consuming it; nullopt when `{` starts no quantifier.
  std::optional<std::pair<int64_t, int64_t>> QuantifierBounds(size_t* length = nullptr) const {
    size_t j = i_;
    if (j >= p_.size() || p_[j] != '{') return std::nullopt;
    auto number = [&](int64_t* out) {
      const size_t start = j;
      *out = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        *out = std::min<int64_t>(*out * 10 + (p_[j] - '0'), int64_t{1} << 40);
        ++j;
      }
      return j > start;
    };
    ++j;
    int64_t min = 0, max = 0;
    if (!number(&min)) return std::nullopt;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(&max)) max = -1;
    } else {
      max = min;
    }
    if (j >= p_.size() || p_[j] != '}') return std::nullopt;
    if (length != nullptr) *length = j + 1 - i_;
    return std::make_pair(min, max);
  }

  absl::StatusOr<RegexNode> Quantified(RegexNode atom) {
    int64_t min, max;
    if (const auto simple = SimpleQuantifier(Peek()); simple && !AtEnd()) {
      ++i_;
      std::tie(min, max) = *simple;
    } else if (size_t length = 0; auto bounds = QuantifierBounds(&length)) {
      i_ += length;
      std::tie(min, max) = *bounds;
      if (max >= 0 && min > max) return Error("{n,m} with n > m");
      if (min > limits_.max_repeat || max > limits_.max_repeat) {
        return Error(absl::StrCat("a repetition bound over ", limits_.max_repeat));
      }
    } else {
      return atom;
    }
    Eat('?');  // lazy: the same strings match
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' || QuantifierBounds().has_value()) {
      return Error("nothing to repeat");
    }
    return RepeatNode(std::move(atom), min, max);
  }

  absl::StatusOr<RegexNode> Class() {
    const bool negated = Eat('^');
    CodePointSet set;
    while (!Eat(']')) {
      if (AtEnd()) return Error("missing ]");
      ASSIGN_OR_RETURN(const CodePointSet lo, ClassAtom());
      if (Peek() == '-' && Peek(1) != ']' && Peek(1) != '\0') {
        ++i_;
        ASSIGN_OR_RETURN(const CodePointSet hi, ClassAtom());
        if (lo.ranges().size() != 1 || hi.ranges().size() != 1 ||
            lo.ranges()[0].first != lo.ranges()[0].second ||
            hi.ranges()[0].first != hi.ranges()[0].second) {
          return Error("a range with a class escape (\\d, \\w, \\s) as an end");
        }
        if (lo.ranges()[0].first > hi.ranges()[0].first) return Error("a range out of order");
        set.Add(lo.ranges()[0].first, hi.ranges()[0].first);
      } else {
        set.Add(lo);
      }
    }
    return CharsNode(negated ? set.Complement() : set);
  }

  absl::StatusOr<CodePointSet> ClassAtom() {
    atom_start_ = i_;
    if (Eat('\\')) {
      if (Eat('b')) return CodePointSet::Of(8, 8);  // backspace, inside a class
      if (Eat('-')) return CodePointSet::Of('-', '-');
      ASSIGN_OR_RETURN(RegexNode n, Escape());
      return n.chars;
    }
    ASSIGN_OR_RETURN(const uint32_t c, CodePoint());
    return CodePointSet::Of(c, c);
  }

  // After a backslash: one code point or a class of them.
  absl::StatusOr<RegexNode> Escape() {
    if (AtEnd()) return Error("\\ at the end of the pattern");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return CharsNode(Digits());
      case 'D':
        return CharsNode(Digits().Complement());
      case 'w':
        return CharsNode(WordChars());
      case 'W':
        return CharsNode(WordChars().Complement());
      case 's':
        return CharsNode(Spaces());
      case 'S':
        return CharsNode(Spaces().Complement());
      case 't':
        return CharsNode(CodePointSet::Of('\t', '\t'));
      case 'n':
        return CharsNode(CodePointSet::Of('\n', '\n'));
      case 'v':
        return CharsNode(CodePointSet::Of('\v', '\v'));
      case 'f':
        return CharsNode(CodePointSet::Of('\f', '\f'));
      case 'r':
        return CharsNode(CodePointSet::Of('\r', '\r'));
      case 'b':
      case 'B':
        return Unsupported("word boundaries (\\b, \\B) are");
      case 'p':
      case 'P':
        return Unsupported("Unicode property escapes (\\p, \\P) are");
      case 'k':
        return Unsupported("backreferences (\\k<name>) are");
      case 'c': {
        const char letter = Peek();
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
          return Error("\\c without a letter");
        }
        ++i_;
        const uint32_t v = static_cast<uint32_t>(letter) % 32;
        return CharsNode(CodePointSet::Of(v, v));
      }
      case 'x': {
        ASSIGN_OR_RETURN(const uint32_t v, Hex(2));
        return CharsNode(CodePointSet::Of(v, v));
      }
      case 'u': {
        ASSIGN_OR_RETURN(const uint32_t v, UnicodeEscape());
        return CharsNode(CodePointSet::Of(v, v));
      }
      default:
        break;
    }
    if (c == '0' && !(Peek() >= '0' && Peek() <= '9')) return CharsNode(CodePointSet::Of(0, 0));
    if (c >= '1' && c <= '9') return Unsupported("backreferences (\\1 ...) are");
    // With the "u" flag only the syntax characters and / escape to themselves.
    if (static_cast<unsigned char>(c) >= 0x80) {
      --i_;
      return Error("an escaped non-ASCII character (write it as itself)");
    }
    if (std::string_view("^$\\.*+?()[]{}|/").find(c) == std::string_view::npos) {
      --i_;
      return Error(absl::StrCat("unknown escape \\", std::string(1, c)));
    }
    return CharsNode(CodePointSet::Of(static_cast<uint8_t>(c), static_cast<uint8_t>(c)));
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    const std::optional<uint32_t> v = ReadHexDigits(p_, &i_, digits);
    if (!v) return Error(absl::StrCat("expected ", digits, " hex digits"));
    return *v;
  }

  // \uHHHH (a high surrogate followed by \uLOW is one code point) or \u{H...}.
  absl::StatusOr<uint32_t> UnicodeEscape() {
    if (Eat('{')) {
      uint32_t v = 0;
      int digits = 0;
      while (HexDigitValue(Peek()) >= 0 && v <= kMaxCodePoint) {
        v = v * 16 + static_cast<uint32_t>(HexDigitValue(p_[i_++]));
        ++digits;
      }
      if (digits == 0 || !Eat('}') || v > kMaxCodePoint) return Error("a malformed \\u{...}");
      if (v >= 0xD800 && v <= 0xDFFF) return Error("a lone surrogate");
      return v;
    }
    ASSIGN_OR_RETURN(const uint32_t hi, Hex(4));
    if (hi < 0xD800 || hi > 0xDFFF) return hi;
    if (hi <= 0xDBFF && EatPrefix("\\u")) {
      ASSIGN_OR_RETURN(const uint32_t lo, Hex(4));
      if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    }
    return Error("a lone surrogate");
  }

  // One literal code point of the pattern's UTF-8.
  absl::StatusOr<uint32_t> CodePoint() {
    std::optional<uint32_t> c = DecodeUtf8(p_, &i_);
    if (!c) return Error("invalid UTF-8");
    return *c;
  }

  std::string_view p_;
  const RegexLimits& limits_;
  size_t i_ = 0;
  size_t atom_start_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<RegexBranch>> ParseRegex(std::string_view pattern,
                                                    const RegexLimits& limits) {
  return Parser(pattern, limits).Run();
}

std::optional<std::pair<int64_t, int64_t>> SimpleQuantifier(char c) {
  switch (c) {
    case '*':
      return std::make_pair(int64_t{0}, int64_t{-1});
    case '+':
      return std::make_pair(int64_t{1}, int64_t{-1});
    case '?':
      return std::make_pair(int64_t{0}, int64_t{1});
    default:
      return std::nullopt;
  }
}

RegexNode CharsNode(CodePointSet set) {
  RegexNode n;
  n.kind = Kind::kChars;
  n.chars = std::move(set);
  return n;
}

RegexNode RepeatNode(RegexNode child, int64_t min, int64_t max) {
  RegexNode r;
  r.kind = Kind::kRepeat;
  r.min = min;
  r.max = max;
  r.children.push_back(std::move(child));
  return r;
}

bool Nullable(const RegexNode& node) {
  switch (node.kind) {
    case Kind::kEmpty:
      return true;
    case Kind::kChars:
    case Kind::kRef:
      return false;
    case Kind::kConcat:
      for (const RegexNode& c : node.children) {
        if (!Nullable(c)) return false;
      }
      return true;
    case Kind::kUnion:
      for (const RegexNode& c : node.children) {
        if (Nullable(c)) return true;
      }
      return false;
    case Kind::kRepeat:
      return node.min == 0 || Nullable(node.children[0]);
  }
  return false;
}

}  // namespace specula::grammar
