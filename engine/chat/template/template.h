// specula::jinja: an interpreter for the subset of Jinja2 that Hugging Face chat templates use
// (docs/CHAT_TEMPLATES.md). Parse once; Render is const and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/template/ast.h"
#include "engine/chat/template/evaluator.h"
#include "engine/chat/template/lexer.h"
#include "engine/chat/template/value.h"
#include "nlohmann/json.hpp"

namespace specula::jinja {

struct ParseOptions {
  LexerOptions lexer;  // transformers' settings by default
  // Errors read "<name> line N: ...".
  std::string name = "template";
};

class Template {
 public:
  // Syntax errors and unsupported constructs: InvalidArgumentError naming the line.
  static absl::StatusOr<std::unique_ptr<Template>> Parse(std::string_view source,
                                                         ParseOptions options = {});

  // Each key of the `context` object is a variable. Errors: InvalidArgumentError; the message of
  // raise_exception("...") as it is, other errors "<name> line N: ...".
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options = {}) const;
  absl::StatusOr<std::string> Render(std::vector<std::pair<std::string, Value>> variables,
                                     const RenderOptions& options = {}) const;

 private:
  Template(StmtList body, std::string name) : body_(std::move(body)), name_(std::move(name)) {}

  StmtList body_;
  std::string name_;
};

// A JSON value as a template value (objects keep their key order; tuples do not exist in JSON).
absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json);

}  // namespace specula::jinja
