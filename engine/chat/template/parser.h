// Builds the syntax tree from the token stream with Jinja2's grammar and precedence (its
// parser.py, rule for rule). Unsupported statements, filters, tests, functions and methods are
// syntax errors naming the construct and its line.
#pragma once

#include <string_view>

#include "engine/chat/template/ast.h"
#include "engine/chat/template/lexer.h"

namespace specula::jinja {

// Statements and expressions nest at most this deep.
inline constexpr int kMaxParseDepth = 100;

// Throws TemplateError (kSyntax).
StmtList ParseTemplate(std::string_view source, const LexerOptions& options);

}  // namespace specula::jinja
