// Splits a template into tokens the way Jinja2's lexer does: template data between tags, and the
// names, literals and operators inside `{{ ... }}` and `{% ... %}`. Comments and the whitespace
// the `-` markers, trim_blocks and lstrip_blocks remove never reach the parser; `{% raw %}`
// bodies come out as data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specula::jinja {

struct LexerOptions {
  // Jinja's defaults are all false; transformers sets trim_blocks and lstrip_blocks.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

enum class TokenType {
  kData,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,  // value holds it: "+", "//", "(", "|"...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // data, name, decoded string, operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Throws TemplateError (kSyntax) on malformed input.
std::vector<Token> Tokenize(std::string_view source, const LexerOptions& options);

// "end of print statement", "'foo'"... for parse errors.
std::string DescribeToken(const Token& token);

}  // namespace specula::jinja
