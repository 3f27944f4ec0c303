// Output constraints compiled once per distinct text: requests with the same JSON Schema share one
// grammar, and so the engine's mask cache for it (engine/generate/output_constraint.h), which is
// what makes an agent's repeated schemas cheap after their first use. Thread-safe; the least
// recently used is dropped past `capacity` (a grammar stays alive while a request uses it).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/grammar/answer_lead.h"
#include "engine/grammar/grammar.h"
#include "specula/v1/specula.pb.h"

namespace specula {

class CompiledConstraints {
 public:
  explicit CompiledConstraints(size_t capacity = 32) : capacity_(capacity) {}

  // The constraint's grammar, or null when it constrains nothing; after `lead` (a reasoning
  // model's think block). INVALID_ARGUMENT naming what the schema does not support (compile
  // errors are not kept).
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> Get(
      const v1::OutputConstraint& c, grammar::AnswerLead lead = grammar::AnswerLead::kNone);
  // The grammar kept under `key`, made by `compile` on first use (strict tool calls).
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> GetOrCompile(
      const std::string& key,
      absl::FunctionRef<absl::StatusOr<std::shared_ptr<const grammar::Grammar>>()> compile);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const grammar::Grammar> grammar;
    std::list<std::string>::iterator use;  // in uses_, most recent first
  };
  const size_t capacity_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_;  // guarded by mu_
  std::list<std::string> uses_;                      // guarded by mu_
};

// Whether `c` constrains anything (unset, or json_object false, does not; an empty choice does,
// and is refused).
bool Constrains(const v1::OutputConstraint& c);

// The process's cache, used by ToEngineRequest.
CompiledConstraints& SharedCompiledConstraints();

}  // namespace specula
