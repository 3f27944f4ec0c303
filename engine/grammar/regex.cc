#include "engine/grammar/regex.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "engine/common/status_macros.h"
#include "engine/grammar/regex_emitter.h"

namespace specula::grammar {
namespace {

using B = GrammarBuilder;
using Kind = RegexNode::Kind;

bool HasEmptyClass(const RegexNode& n) {
  if (n.kind == Kind::kChars) return n.chars.empty();
  for (const RegexNode& c : n.children) {
    if (HasEmptyClass(c)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<int32_t> AddRegex(std::string_view pattern, const RegexOptions& options,
                                 GrammarBuilder& b) {
  ASSIGN_OR_RETURN(const std::vector<RegexBranch> branches, ParseRegex(pattern, options.limits));
  for (const RegexBranch& branch : branches) {
    if (HasEmptyClass(branch.node)) {
      return absl::InvalidArgumentError("regex: a character class no character satisfies");
    }
  }
  RegexEmitter emit(b, options.text);
  const bool search = options.match == RegexMatch::kSearch;
  std::vector<Alternative> alternatives;
  for (const RegexBranch& branch : branches) {
    Alternative a;
    if (search && !branch.anchored_start) a.push_back(B::Ref(emit.AnyText()));
    emit.Append(branch.node, a);
    if (search && !branch.anchored_end) a.push_back(B::Ref(emit.AnyText()));
    alternatives.push_back(std::move(a));
  }
  return b.AddRule("regex", std::move(alternatives));
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileRegex(std::string_view pattern,
                                                            const RegexOptions& options,
                                                            int64_t max_symbols) {
  GrammarBuilder b(max_symbols);
  ASSIGN_OR_RETURN(const int32_t root, AddRegex(pattern, options, b));
  ASSIGN_OR_RETURN(Grammar g, b.Build(root));
  return std::make_shared<const Grammar>(std::move(g));
}

}  // namespace specula::grammar
