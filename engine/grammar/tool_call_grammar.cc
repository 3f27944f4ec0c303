#include "engine/grammar/tool_call_grammar.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/grammar/json_rules.h"

namespace specula::grammar {
namespace {

// Appends `symbols` to `alternative`.
void Append(Alternative* alternative, const Alternative& symbols) {
  alternative->insert(alternative->end(), symbols.begin(), symbols.end());
}

class ToolCallCompiler {
 public:
  explicit ToolCallCompiler(const ToolCallGrammarOptions& options)
      : options_(options), b_(options.json.max_symbols), json_(b_, options.json.max_whitespace) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Run(const std::vector<ToolSchema>& tools) {
    if (tools.empty()) return absl::InvalidArgumentError("a tool-call grammar needs tools");
    if (options_.start == ToolCallStart::kArguments && tools.size() != 1) {
      return absl::InvalidArgumentError("a named tool call's grammar takes that one tool");
    }
    std::vector<Alternative> calls;
    for (const ToolSchema& tool : tools) {
      ASSIGN_OR_RETURN(const int32_t arguments, Arguments(tool));
      calls.push_back(Call(tool, arguments));
    }
    Alternative root;
    if (options_.start == ToolCallStart::kObject) {
      root = {GrammarBuilder::Ref(json_.Whitespace())};
      Append(&root, GrammarBuilder::Literal("{"));
      root.push_back(Ws());
      Append(&root, GrammarBuilder::Literal("\"name\""));
      root.push_back(Ws());
      Append(&root, GrammarBuilder::Literal(":"));
      root.push_back(Ws());
    }
    root.push_back(GrammarBuilder::Ref(b_.AddRule("tool_call", std::move(calls))));
    root.push_back(Ws());
    Append(&root, GrammarBuilder::Literal("}"));
    if (!options_.closing.empty()) {
      root.push_back(Ws());
      Append(&root, GrammarBuilder::Literal(options_.closing));
    }
    ASSIGN_OR_RETURN(Grammar g, b_.Build(b_.AddRule("root", {std::move(root)})));
    return std::make_shared<const Grammar>(std::move(g));
  }

 private:
  Symbol Ws() { return GrammarBuilder::Ref(json_.Whitespace()); }

  absl::StatusOr<int32_t> Arguments(const ToolSchema& tool) {
    if (!tool.strict) return json_.AnyObject();
    JsonSchemaOptions json = options_.json;
    json.strict = true;  // OpenAI: additionalProperties defaults to false under strict
    const nlohmann::ordered_json schema =
        tool.parameters.is_null()
            ? nlohmann::ordered_json{{"type", "object"},
                                     {"properties", nlohmann::ordered_json::object()}}
            : tool.parameters;
    absl::StatusOr<int32_t> rule = AddJsonSchema(schema, json, b_, json_);
    if (!rule.ok()) {
      return absl::Status(rule.status().code(),
                          absl::StrCat("the parameters of the strict tool '", tool.name,
                                       "': ", rule.status().message()));
    }
    return rule;
  }

  // The call from where the text starts to the arguments' end.
  Alternative Call(const ToolSchema& tool, int32_t arguments) {
    Alternative call;
    if (options_.start != ToolCallStart::kArguments) {
      std::string name = nlohmann::ordered_json(tool.name).dump();  // quoted, escaped
      if (options_.start == ToolCallStart::kAfterNameQuote) name.erase(0, 1);
      Append(&call, GrammarBuilder::Literal(name));
      call.push_back(Ws());
      Append(&call, GrammarBuilder::Literal(","));
      call.push_back(Ws());
      Append(&call, GrammarBuilder::Literal(absl::StrCat("\"", options_.arguments_key, "\"")));
      call.push_back(Ws());
      Append(&call, GrammarBuilder::Literal(":"));
      call.push_back(Ws());
    }
    call.push_back(GrammarBuilder::Ref(arguments));
    return call;
  }

  const ToolCallGrammarOptions& options_;
  GrammarBuilder b_;
  JsonRules json_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> ToolCallGrammar(
    const std::vector<ToolSchema>& tools, const ToolCallGrammarOptions& options) {
  return ToolCallCompiler(options).Run(tools);
}

}  // namespace specula::grammar
