#include "engine/chat/template/template.h"

#include <new>

#include "absl/status/status.h"
#include "engine/chat/template/error.h"
#include "engine/chat/template/parser.h"
#include "engine/chat/template/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace specula::jinja {
namespace {

// raise_exception is the template refusing the request: INVALID_ARGUMENT with its message as
// is. Other errors are the template's own: INVALID_ARGUMENT while parsing (a load error), and
// FAILED_PRECONDITION while rendering (the server's template could not render this request;
// the client did nothing the API forbids).
absl::Status ToStatus(const TemplateError& e, const std::string& name, bool rendering) {
  if (e.kind() == TemplateError::Kind::kRaised) return absl::InvalidArgumentError(e.message());
  const std::string message = e.line() <= 0 ? Cat(name, ": ", e.message())
                                            : Cat(name, " line ", e.line(), ": ", e.message());
  return rendering ? absl::FailedPreconditionError(message) : absl::InvalidArgumentError(message);
}

void CheckUtf8(std::string_view s, std::string_view what) {
  if (tokenizer_internal::FindInvalidUtf8(s) != std::string_view::npos) {
    ThrowRuntime(Cat(what, " is not valid UTF-8"));
  }
}

Value FromJson(const nlohmann::ordered_json& json, int depth) {
  if (depth > kMaxValueDepth) {
    ThrowRuntime(Cat("JSON input nests deeper than ", kMaxValueDepth, " levels"));
  }
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
    case Type::discarded:
      return Value::None();
    case Type::boolean:
      return Value::Bool(json.get<bool>());
    case Type::number_integer:
      return Value::Int(json.get<int64_t>());
    case Type::number_unsigned: {
      const auto u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case Type::number_float:
      return Value::Float(json.get<double>());
    case Type::string: {
      const auto& s = json.get_ref<const std::string&>();
      CheckUtf8(s, "a JSON string");
      return Value::Str(s);
    }
    case Type::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item, depth + 1));
      return Value::List(std::move(items));
    }
    case Type::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(json.size());
      for (const auto& [key, value] : json.items()) {
        CheckUtf8(key, "a JSON key");
        items.emplace_back(Value::Str(key), FromJson(value, depth + 1));
      }
      return Value::Dict(std::move(items));
    }
    case Type::binary:
      ThrowRuntime("binary JSON values are not supported");
  }
  return Value::None();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(std::string_view source,
                                                          ParseOptions options) {
  try {
    CheckUtf8(source, "the template");
    StmtList body = ParseTemplate(source, options.lexer);
    return std::unique_ptr<Template>(new Template(std::move(body), std::move(options.name)));
  } catch (const TemplateError& e) {
    return ToStatus(e, options.name, /*rendering=*/false);
  }
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context,
                                             const RenderOptions& options) const {
  if (!context.is_object() && !context.is_null()) {
    return absl::InvalidArgumentError("the template context must be a JSON object");
  }
  std::vector<std::pair<std::string, Value>> variables;
  if (context.is_object()) {
    for (const auto& [key, value] : context.items()) {
      absl::StatusOr<Value> v = ValueFromJson(value);
      if (!v.ok()) return v.status();
      variables.emplace_back(key, *std::move(v));
    }
  }
  return Render(std::move(variables), options);
}

absl::StatusOr<std::string> Template::Render(std::vector<std::pair<std::string, Value>> variables,
                                             const RenderOptions& options) const {
  auto root = std::make_shared<Scope>(nullptr);
  for (auto& [name, value] : variables) root->Set(name, std::move(value));
  Evaluator evaluator(options, root);
  try {
    return evaluator.Render(body_);
  } catch (TemplateError& e) {
    if (e.line() == 0) e.set_line(evaluator.line());
    return ToStatus(e, name_, /*rendering=*/true);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(name_ + ": out of memory while rendering");
  }
}

absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& json) {
  try {
    return FromJson(json, 0);
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(e.message());
  }
}

}  // namespace specula::jinja
