#include "server/compiled_constraints.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/grammar/answer_lead.h"
#include "engine/grammar/ebnf.h"
#include "engine/grammar/json_rules.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/regex.h"
#include "server/request_json.h"

namespace specula {
namespace {

// The rules of `in`'s texts, added to `b`.
absl::StatusOr<int32_t> AddConstraintRules(const v1::OutputConstraint& in,
                                           grammar::GrammarBuilder& b, grammar::JsonRules& json) {
  switch (in.kind_case()) {
    case v1::OutputConstraint::kJsonObject:
      return json.AnyObject();
    case v1::OutputConstraint::kRegex:
      return grammar::AddRegex(in.regex(), grammar::RegexOptions(), b);
    case v1::OutputConstraint::kGrammar:
      return grammar::AddEbnf(in.grammar(), b);
    case v1::OutputConstraint::kChoice:
      if (in.choice().options().empty()) {
        return absl::InvalidArgumentError("choice: give at least one option");
      }
      return json.LiteralChoice("choice", std::vector<std::string>(in.choice().options().begin(),
                                                                   in.choice().options().end()));
    default: {
      ASSIGN_OR_RETURN(const OrderedJson schema,
                       ParseRequestJson(in.json_schema(), "output_constraint.json_schema"));
      grammar::JsonSchemaOptions options;
      options.strict = in.strict();
      return grammar::AddJsonSchema(schema, options, b, json);
    }
  }
}

// After a think block the line breaks before the answer are not content (the reasoning parser
// strips them), so an answer that may itself begin with one could come back without it.
absl::Status CheckAnswerAfterReasoning(const std::shared_ptr<const grammar::Grammar>& g,
                                       grammar::AnswerLead lead) {
  if (lead == grammar::AnswerLead::kNone) return absl::OkStatus();
  grammar::GrammarMatcher m(g);
  const std::string block =
      absl::StrCat(lead == grammar::AnswerLead::kOptionalReasoning ? grammar::kThinkOpen : "",
                   grammar::kThinkClose, std::string(grammar::kMaxLineBreaks, '\n'));
  if (m.Advance(block) && m.Allows('\n')) {
    return absl::InvalidArgumentError(
        "its text may begin with a line break, which cannot follow a reasoning model's think "
        "block (the line breaks after it are not content); turn thinking off "
        "(chat_template_kwargs {\"enable_thinking\": false}) or start the text otherwise");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> CompileWithLead(
    const v1::OutputConstraint& in, grammar::AnswerLead lead) {
  const grammar::JsonSchemaOptions defaults;
  grammar::GrammarBuilder b(defaults.max_symbols);
  grammar::JsonRules json(b, defaults.max_whitespace);
  ASSIGN_OR_RETURN(const int32_t answer, AddConstraintRules(in, b, json));
  ASSIGN_OR_RETURN(grammar::Grammar g, b.Build(grammar::AddAnswerLead(b, lead, answer)));
  auto shared = std::make_shared<const grammar::Grammar>(std::move(g));
  RETURN_IF_ERROR(CheckAnswerAfterReasoning(shared, lead));
  return shared;
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> Compile(const v1::OutputConstraint& in,
                                                                grammar::AnswerLead lead) {
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = CompileWithLead(in, lead);
  if (!g.ok()) {
    return absl::Status(g.status().code(),
                        absl::StrCat("output_constraint: ", g.status().message()));
  }
  return g;
}

// The kind and everything that changes its grammar: the cache key, after the answer lead.
std::string KindKey(const v1::OutputConstraint& c) {
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonObject:
      return "object";
    case v1::OutputConstraint::kRegex:
      return absl::StrCat("regex:", c.regex());
    case v1::OutputConstraint::kGrammar:
      return absl::StrCat("ebnf:", c.grammar());
    case v1::OutputConstraint::kChoice: {
      std::string key = "choice:";
      // Length-prefixed, so that no two lists share a key.
      for (const std::string& o : c.choice().options()) absl::StrAppend(&key, o.size(), ":", o);
      return key;
    }
    default:
      return absl::StrCat(c.strict() ? "strict:" : "schema:", c.json_schema());
  }
}

}  // namespace

bool Constrains(const v1::OutputConstraint& c) {
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonObject:
      return c.json_object();
    case v1::OutputConstraint::KIND_NOT_SET:
      return false;
    default:
      return true;
  }
}

absl::StatusOr<std::shared_ptr<const grammar::Grammar>> CompiledConstraints::Get(
    const v1::OutputConstraint& c, grammar::AnswerLead lead) {
  if (!Constrains(c)) return std::shared_ptr<const grammar::Grammar>();
  return GetOrCompile(absl::StrCat(static_cast<int>(lead), ":", KindKey(c)),
                      [&c, lead] { return Compile(c, lead); });
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
