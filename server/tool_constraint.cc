#include "server/tool_constraint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/grammar/tool_call_grammar.h"
#include "server/compiled_constraints.h"

namespace specula {
namespace {

using grammar::ToolCallStart;

std::vector<grammar::ToolSchema> ToolSchemas(const ChatRequest& request) {
  std::vector<grammar::ToolSchema> tools;
  for (const OrderedJson& tool : request.tools) {
    const OrderedJson& function = tool["function"];
    grammar::ToolSchema t;
    t.name = function["name"].get<std::string>();
    t.parameters = function.value("parameters", OrderedJson());
    t.strict = request.strict_tools.contains(t.name);
    tools.push_back(std::move(t));
  }
  return tools;
}

// The compiled grammar of `tools` from `start`, shared by requests with the same tools.
absl::StatusOr<std::shared_ptr<const grammar::Grammar>> Compiled(
    std::vector<grammar::ToolSchema> tools, ToolCallStart start, ToolCallSyntax syntax) {
  grammar::ToolCallGrammarOptions options;
  options.start = start;
  options.arguments_key = syntax == ToolCallSyntax::kLlama3Json ? "parameters" : "arguments";
  options.closing = std::string(ToolCallClosing(syntax));
  std::string key = absl::StrCat("tools:", static_cast<int>(start), ":", options.arguments_key, ":",
                                 options.closing);
  OrderedJson entries = OrderedJson::array();  // JSON: no two tool lists write the same key
  for (const grammar::ToolSchema& t : tools) {
    entries.push_back(OrderedJson::array({t.strict, t.name, t.parameters}));
  }
  absl::StrAppend(&key, "\n", entries.dump());
  return SharedCompiledConstraints().GetOrCompile(
      key, [&] { return grammar::ToolCallGrammar(tools, options); });
}

}  // namespace

absl::StatusOr<ConstraintSpec> StrictToolConstraint(const ChatRequest& request,
                                                    ToolCallSyntax syntax,
                                                    bool forced_prefix_written) {
  ConstraintSpec spec;
  if (!ToolsShown(request) || request.strict_tools.empty()) return spec;
  std::vector<grammar::ToolSchema> tools = ToolSchemas(request);
  spec.ends_output = false;
  const ToolChoice& choice = request.tool_choice;
  if (forced_prefix_written && choice.kind == ToolChoice::Kind::kRequired) {
    ASSIGN_OR_RETURN(spec.grammar, Compiled(tools, ToolCallStart::kAfterNameQuote, syntax));
  } else if (forced_prefix_written && choice.kind == ToolChoice::Kind::kFunction &&
             request.strict_tools.contains(choice.function)) {
    std::vector<grammar::ToolSchema> named;
    for (grammar::ToolSchema& t : tools) {
      if (t.name == choice.function) named.push_back(t);
    }
    ASSIGN_OR_RETURN(spec.grammar, Compiled(std::move(named), ToolCallStart::kArguments, syntax));
  }
  if (!ToolCallOpening(syntax).empty()) {
    spec.trigger = std::string(ToolCallOpening(syntax));
    ASSIGN_OR_RETURN(spec.triggered, Compiled(std::move(tools), ToolCallStart::kObject, syntax));
  } else if (spec.grammar == nullptr) {
    // A forced call of a tool that is not strict, and no later call to watch for.
    if (forced_prefix_written && choice.kind == ToolChoice::Kind::kFunction)
      return ConstraintSpec();
    return absl::InvalidArgumentError(
        "strict tools need tool_choice \"required\" or a named function with this model's "
        "tool-call syntax (Llama 3.1 JSON has no opening tag that would start the constraint)");
  }
  return spec;
}

}  // namespace specula
