#include "engine/chat/template/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "engine/chat/template/error.h"
#include "engine/chat/template/py_str.h"
#include "engine/chat/template/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace specula::jinja {
namespace {

enum class TagKind { kVariable, kBlock, kComment, kRaw };

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Newlines are "\n" from here on; one trailing newline goes unless kept (Jinja's lexer).
std::string Normalize(std::string_view source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') {
      out += source[i];
      continue;
    }
    out += '\n';
    if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Decodes the escapes of a Python string literal body (Jinja applies "unicode-escape").
class StringUnescaper {
 public:
  StringUnescaper(std::string_view body, int line) : s_(body), line_(line) {}

  std::string Run() {
    std::string out;
    for (size_t i = 0; i < s_.size(); ++i) {
      if (s_[i] != '\\' || i + 1 == s_.size()) {
        out += s_[i];
        continue;
      }
      i = Escape(i + 1, &out);
    }
    return out;
  }

 private:
  // Handles the escape whose letter is at s_[i]; returns the index of its last character.
  size_t Escape(size_t i, std::string* out) {
    const char c = s_[i];
    static constexpr std::string_view kFrom = "\\'\"abfnrtv\n", kTo = "\\'\"\a\b\f\n\r\t\v";
    if (const size_t k = kFrom.find(c); k != std::string_view::npos) {
      if (c != '\n') *out += kTo[k];  // backslash-newline is a line continuation
      return i;
    }
    if (c >= '0' && c <= '7') {
      size_t end = i;
      while (end < s_.size() && end < i + 3 && s_[end] >= '0' && s_[end] <= '7') ++end;
      py::AppendCodepoint(std::stoul(std::string(s_.substr(i, end - i)), nullptr, 8), out);
      return end - 1;
    }
    const int width = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (width == 0) {
      if (c == 'N') ThrowSyntax("\\N{...} escapes are not supported in string literals", line_);
      *out += '\\';
      *out += c;
      return i;
    }
    const std::string_view hex = s_.substr(i + 1, width);
    if (hex.size() != static_cast<size_t>(width) ||
        hex.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos) {
      ThrowSyntax(Cat("truncated \\", std::string(1, c), " escape in string literal"), line_);
    }
    const unsigned long cp = std::stoul(std::string(hex), nullptr, 16);
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      ThrowSyntax("invalid code point escape in string literal", line_);
    }
    py::AppendCodepoint(static_cast<uint32_t>(cp), out);
    return i + width;
  }

  std::string_view s_;
  int line_;
};

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : src_(std::move(source)), options_(options) {}

  std::vector<Token> Run() {
    while (pos_ < src_.size()) LexRoot();
    Emit(TokenType::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  struct Opening {
    size_t at;     // position of the delimiter
    size_t after;  // first position after it (and its sign)
    TagKind kind;
    char sign;  // '-', '+' or 0
  };

  // ---- root state: data up to the next tag, then the tag
  void LexRoot() {
    const std::optional<Opening> open = FindOpening();
    if (!open) {
      EmitData(std::string_view(src_).substr(pos_), pos_);
      pos_ = src_.size();
      return;
    }
    EmitStrippedData(*open);
    pos_ = open->after;
    line_starting_ = src_[pos_ - 1] == '\n';
    switch (open->kind) {
      case TagKind::kVariable:
        Emit(TokenType::kVariableBegin, "{{", open->at);
        return LexTag(TagKind::kVariable);
      case TagKind::kBlock:
        Emit(TokenType::kBlockBegin, "{%", open->at);
        return LexTag(TagKind::kBlock);
      case TagKind::kComment:
        return LexComment(open->at);
      case TagKind::kRaw:
        return LexRaw(open->at);
    }
  }

  std::optional<Opening> FindOpening() const {
    for (size_t at = src_.find('{', pos_); at != std::string::npos; at = src_.find('{', at + 1)) {
      if (at + 1 >= src_.size()) break;
      const char c = src_[at + 1];
      if (c != '{' && c != '%' && c != '#') continue;
      Opening o{at, at + 2, TagKind::kVariable, 0};
      if (o.after < src_.size() && (src_[o.after] == '-' || src_[o.after] == '+')) {
        o.sign = src_[o.after++];
      }
      o.kind = c == '{' ? TagKind::kVariable : c == '#' ? TagKind::kComment : TagKind::kBlock;
      if (c == '%') {
        if (const size_t end = MatchRawBegin(o.after); end != 0) {
          o.kind = TagKind::kRaw;
          o.after = end;
        }
      }
      return o;
    }
    return std::nullopt;
  }

  // `\s*raw\s*(-%}\s*|%})` at `at`; returns the end, or 0.
  size_t MatchRawBegin(size_t at) const {
    size_t i = SkipSpace(at);
    if (src_.compare(i, 3, "raw") != 0) return 0;
    i = SkipSpace(i + 3);
    if (src_.compare(i, 3, "-%}") == 0) return SkipSpace(i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return 0;
  }

  // Data before a tag, less what `-` or lstrip_blocks remove.
  void EmitStrippedData(const Opening& open) {
    std::string_view text = std::string_view(src_).substr(pos_, open.at - pos_);
    if (open.sign == '-') {
      const std::string stripped = py::Strip(text, std::nullopt, false, true);
      text = text.substr(0, stripped.size());
    } else if (open.sign != '+' && open.kind != TagKind::kVariable) {
      text = LStripBlock(text);
    }
    EmitData(text, pos_);
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  std::string_view LStripBlock(std::string_view text) const {
    if (!options_.lstrip_blocks) return text;
    const size_t nl = text.rfind('\n');
    const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
    if (line_start == 0 && !line_starting_) return text;
    if (text.find_first_not_of(" \t", line_start) != std::string_view::npos) return text;
    return text.substr(0, line_start);
  }

  // ---- inside {{ }} and {% %}
  void LexTag(TagKind kind) {
    while (true) {
      if (pos_ >= src_.size()) {
        ThrowSyntax(kind == TagKind::kBlock ? "unexpected end of template, expected '%}'"
                                            : "unexpected end of template, expected '}}'",
                    LineAt(pos_));
      }
      if (braces_.empty() && MatchTagEnd(kind)) return;
      LexToken();
    }
  }

  bool MatchTagEnd(TagKind kind) {
    const size_t start = pos_;
    const std::string_view close = kind == TagKind::kBlock ? "%}" : "}}";
    if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
      pos_ = SkipSpace(pos_ + 3);
    } else if (kind == TagKind::kBlock && src_.compare(pos_, 3, "+%}") == 0) {
      pos_ += 3;
    } else if (src_.compare(pos_, 2, close) == 0) {
      pos_ += 2;
      if (kind == TagKind::kBlock) SkipTrimmedNewline();
    } else {
      return false;
    }
    Emit(kind == TagKind::kBlock ? TokenType::kBlockEnd : TokenType::kVariableEnd,
         std::string(close), start);
    line_starting_ = src_[pos_ - 1] == '\n';
    return true;
  }

  void SkipTrimmedNewline() {
    if (options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') ++pos_;
  }

  void LexToken() {
    const char c = src_[pos_];
    if (const size_t end = SkipSpace(pos_); end != pos_) {
      pos_ = end;
    } else if (IsDigit(c)) {
      LexNumber();
    } else if (IsNameStart(c)) {
      size_t end = pos_;
      while (end < src_.size() && IsNameChar(src_[end])) ++end;
      Emit(TokenType::kName, src_.substr(pos_, end - pos_), pos_);
      pos_ = end;
    } else if (c == '\'' || c == '"') {
      LexString();
    } else {
      LexOperator();
    }
  }

  // `(\d+_)*\d+` at i: the end of the digits, or i.
  size_t ScanDigits(size_t i) const {
    size_t end = i;
    while (end < src_.size() && IsDigit(src_[end])) {
      ++end;
      if (end + 1 < src_.size() && src_[end] == '_' && IsDigit(src_[end + 1])) ++end;
    }
    return end;
  }

  // The end of a float literal at pos_, or 0 (Jinja's float_re):
  // digits ((.digits)? e[+-]?digits | .digits), not right after a dot.
  size_t ScanFloat() const {
    if (pos_ > 0 && src_[pos_ - 1] == '.') return 0;
    const size_t int_end = ScanDigits(pos_);
    size_t frac_end = 0;
    if (int_end < src_.size() && src_[int_end] == '.') {
      const size_t e = ScanDigits(int_end + 1);
      if (e > int_end + 1) frac_end = e;
    }
    const size_t exp_at = frac_end ? frac_end : int_end;
    if (exp_at < src_.size() && (src_[exp_at] == 'e' || src_[exp_at] == 'E')) {
      size_t i = exp_at + 1;
      if (i < src_.size() && (src_[i] == '+' || src_[i] == '-')) ++i;
      const size_t e = ScanDigits(i);
      if (e > i) return e;
    }
    return frac_end;
  }

  // `(_?d)*` at i for digits d of `base` (only '0' when base is 1); returns the end.
  size_t ScanIntDigits(size_t i, int base) const {
    auto is_digit = [base](char ch) {
      if (base == 1) return ch == '0';
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(ch)) != 0;
      return ch >= '0' && ch < '0' + base;
    };
    while (true) {
      const size_t j = i < src_.size() && src_[i] == '_' ? i + 1 : i;
      if (j >= src_.size() || !is_digit(src_[j])) return i;
      i = j + 1;
    }
  }

  void LexNumber() {
    const size_t start = pos_;
    if (const size_t end = ScanFloat(); end != 0) {
      std::string text;
      for (char ch : src_.substr(start, end - start)) {
        if (ch != '_') text += ch;
      }
      pos_ = end;
      Emit(TokenType::kFloat, text, start).float_value = std::strtod(text.c_str(), nullptr);
      return;
    }
    // 0b.., 0o.., 0x.., [1-9](_?\d)*, 0(_?0)*
    int base = 10;
    size_t digits = start, end = 0;
    if (src_[start] == '0' && start + 1 < src_.size()) {
      const char p = static_cast<char>(src_[start + 1] | 0x20);
      const int prefixed = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
      if (prefixed != 0 && (end = ScanIntDigits(start + 2, prefixed)) > start + 2) {
        base = prefixed;
        digits = start + 2;
      }
    }
    if (base == 10) end = ScanIntDigits(start + 1, src_[start] == '0' ? 1 : 10);
    std::string text;
    for (char ch : src_.substr(digits, end - digits)) {
      if (ch != '_') text += ch;
    }
    pos_ = end;
    errno = 0;
    Token& t = Emit(TokenType::kInteger, src_.substr(start, end - start), start);
    t.int_value = std::strtoll(text.c_str(), nullptr, base);
    if (errno == ERANGE) ThrowSyntax("integer literal too large", t.line);
  }

  void LexString() {
    const char quote = src_[pos_];
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size()) {
      ThrowSyntax(Cat("unexpected char '", std::string(1, quote), "' at ", pos_), LineAt(pos_));
    }
    const int line = LineAt(pos_);
    const std::string body = src_.substr(pos_ + 1, i - pos_ - 1);
    Emit(TokenType::kString, StringUnescaper(body, line).Run(), pos_);
    pos_ = i + 1;
  }

  void LexOperator() {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(TokenType::kOperator, std::string(op), pos_);
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      std::string shown;
      py::AppendCodepoint(
          py::Decode(std::string_view(src_).substr(pos_, tokenizer_internal::Utf8CharLen(c)))[0],
          &shown);
      ThrowSyntax(Cat("unexpected char '", shown, "' at ", pos_), LineAt(pos_));
    }
    Balance(c);
    Emit(TokenType::kOperator, std::string(1, c), pos_);
    ++pos_;
  }

  void Balance(char c) {
    if (c == '(' || c == '[' || c == '{') {
      braces_.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (braces_.empty()) ThrowSyntax(Cat("unexpected '", std::string(1, c), "'"), LineAt(pos_));
      if (braces_.back() != c) {
        ThrowSyntax(Cat("unexpected '", std::string(1, c), "', expected '",
                        std::string(1, braces_.back()), "'"),
                    LineAt(pos_));
      }
      braces_.pop_back();
    }
  }

  // ---- comments and raw blocks
  void LexComment(size_t at) {
    for (size_t q = src_.find("#}", pos_); q != std::string::npos; q = src_.find("#}", q + 1)) {
      const char before = q > pos_ ? src_[q - 1] : 0;
      pos_ = q + 2;
      if (before == '-') {
        pos_ = SkipSpace(pos_);
      } else if (before != '+') {
        SkipTrimmedNewline();
      }
      line_starting_ = src_[pos_ - 1] == '\n';
      return;
    }
    ThrowSyntax("Missing end of comment tag", LineAt(at));
  }

  void LexRaw(size_t at) {
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t i = q + 2;
      const char sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i++] : 0;
      i = SkipSpace(i);
      if (src_.compare(i, 6, "endraw") != 0) continue;
      const size_t saved = pos_;
      pos_ = SkipSpace(i + 6);
      if (!MatchRawEnd()) {
        pos_ = saved;
        continue;
      }
      const size_t end = pos_;
      pos_ = saved;
      EmitStrippedData(Opening{q, 0, TagKind::kRaw, sign});
      pos_ = end;
      line_starting_ = src_[pos_ - 1] == '\n';
      return;
    }
    ThrowSyntax("Missing end of raw directive", LineAt(at));
  }

  bool MatchRawEnd() {
    if (src_.compare(pos_, 3, "+%}") == 0) {
      pos_ += 3;
    } else if (src_.compare(pos_, 3, "-%}") == 0) {
      pos_ = SkipSpace(pos_ + 3);
    } else if (src_.compare(pos_, 2, "%}") == 0) {
      pos_ += 2;
      SkipTrimmedNewline();
    } else {
      return false;
    }
    return true;
  }

  // ---- helpers
  // Skips Python whitespace (`\s*`).
  size_t SkipSpace(size_t i) const {
    while (i < src_.size()) {
      const auto c = static_cast<unsigned char>(src_[i]);
      if (c < 0x80) {
        if (!py::IsSpace(c)) break;
        ++i;
        continue;
      }
      size_t len = 1;
      if (!py::IsSpace(tokenizer_internal::DecodeCodepoint(std::string_view(src_).substr(i), &len)))
        break;
      i += len;
    }
    return i;
  }

  void EmitData(std::string_view text, size_t at) {
    if (!text.empty()) Emit(TokenType::kData, std::string(text), at);
  }

  Token& Emit(TokenType type, std::string value, size_t at) {
    Token& t = tokens_.emplace_back();
    t.type = type;
    t.value = std::move(value);
    t.line = LineAt(at);
    return t;
  }

  // Line of a position; positions asked for only move forward, mostly.
  int LineAt(size_t at) {
    if (at < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < at && line_pos_ < src_.size(); ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  std::string src_;
  LexerOptions options_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<char> braces_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(Normalize(source, options.keep_trailing_newline), options).Run();
}

std::string DescribeToken(const Token& token) {
  switch (token.type) {
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kEof:
      return "end of template";
    case TokenType::kData:
      return "template data";
    case TokenType::kString:
      return "string";
    default:
      return "'" + token.value + "'";
  }
}

}  // namespace specula::jinja
