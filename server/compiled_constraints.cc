#include "server/compiled_constraints.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/grammar/json_schema.h"
#include "server/request_json.h"

namespace specula {
namespace {

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> Compile(const v1::OutputConstraint& in) {
  grammar::JsonSchemaOptions options;
  options.strict = in.strict();
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g;
  if (in.kind_case() == v1::OutputConstraint::kJsonObject) {
    g = grammar::AnyJsonObject(options);
  } else {
    absl::StatusOr<OrderedJson> schema =
        ParseRequestJson(in.json_schema(), "output_constraint.json_schema");
    if (!schema.ok()) return schema.status();
    g = grammar::CompileJsonSchema(*schema, options);
  }
  if (!g.ok()) {
    return absl::Status(g.status().code(), absl::StrCat("output_constraint (response_format): ",
                                                        g.status().message()));
  }
  return g;
}

}  // namespace

bool Constrains(const v1::OutputConstraint& c) {
  return c.kind_case() == v1::OutputConstraint::kJsonSchema ||
         (c.kind_case() == v1::OutputConstraint::kJsonObject && c.json_object());
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> CompiledConstraints::Get(
    const v1::OutputConstraint& c) {
  if (!Constrains(c)) return std::shared_ptr<const grammar::Grammar>();
  const std::string key = c.kind_case() == v1::OutputConstraint::kJsonObject
                              ? "object"
                              : absl::StrCat(c.strict() ? "strict:" : "schema:", c.json_schema());
  return GetOrCompile(key, [&c] { return Compile(c); });
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> CompiledConstraints::GetOrCompile(
    const std::string& key,
    absl::FunctionRef<absl::StatusOr<std::shared_ptr<const grammar::Grammar>>()> compile) {
  {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      uses_.splice(uses_.begin(), uses_, it->second.use);
      return it->second.grammar;
    }
  }
  // Compiled outside the lock: a big schema takes milliseconds, other requests need not wait.
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = compile();
  if (!g.ok()) return g.status();
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.grammar;
  uses_.push_front(key);
  entries_[key] = {*g, uses_.begin()};
  if (entries_.size() > capacity_) {
    entries_.erase(uses_.back());
    uses_.pop_back();
  }
  return g;
}

size_t CompiledConstraints::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

CompiledConstraints& SharedCompiledConstraints() {
  static auto* const cache = new CompiledConstraints();
  return *cache;
}

}  // namespace specula
