// Strict tool calls' grammars: the call object from each start the server can leave it at, a
// strict tool's arguments held to its schema, a free tool's to any object, and names only of the
// request's tools.
#include "engine/grammar/tool_call_grammar.h"

#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;
using Json = nlohmann::ordered_json;

std::vector<ToolSchema> WeatherAndSearch() {
  return {
      {"get_weather", Json::parse(R"({"type": "object", "properties": {"days": {"type": "integer"}},
                          "required": ["days"]})"),
       true},
      {"search", Json::parse(R"({"type": "object"})"), false}};
}

std::shared_ptr<const Grammar> Build(const std::vector<ToolSchema>& tools, ToolCallStart start,
                                     const char* arguments_key = "arguments") {
  ToolCallGrammarOptions options;
  options.start = start;
  options.arguments_key = arguments_key;
  auto g = ToolCallGrammar(tools, options);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(ToolCallGrammarTest, AWholeCallObject) {
  auto g = Build(WeatherAndSearch(), ToolCallStart::kObject);
  EXPECT_TRUE(Accepts(g, R"({"name": "get_weather", "arguments": {"days": 3}})"));
  EXPECT_TRUE(Accepts(g, "\n{\"name\":\"get_weather\",\"arguments\":{\"days\":3}}"));
  // A free tool takes any object; a strict one only its schema (no extra keys under strict).
  EXPECT_TRUE(Accepts(g, R"({"name": "search", "arguments": {"q": [1, {"x": null}]}})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "get_weather", "arguments": {"days": "3"}})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "get_weather", "arguments": {"days": 3, "x": 1}})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "get_weather", "arguments": {}})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "delete_all", "arguments": {}})"));
  GrammarMatcher m(g);
  EXPECT_TRUE(m.Advance(R"({"name": "search", "arguments": {}})"));
  EXPECT_TRUE(m.IsComplete());
}

// Hermes: the closing tag is part of the call, so a call under the grammar is always closed.
TEST(ToolCallGrammarTest, TheClosingTagEndsTheCall) {
  ToolCallGrammarOptions options;
  options.closing = "</tool_call>";
  auto g = ToolCallGrammar(WeatherAndSearch(), options).value();
  EXPECT_TRUE(Accepts(g, "\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(g, R"({"name": "search", "arguments": {}})"));
  GrammarMatcher m(g);
  EXPECT_TRUE(m.Advance(R"({"name": "search", "arguments": {}}</tool_call>)"));
  EXPECT_TRUE(m.IsComplete());
}

TEST(ToolCallGrammarTest, AfterTheForcedOpeningOfARequiredCall) {
  auto g = Build(WeatherAndSearch(), ToolCallStart::kAfterNameQuote);
  EXPECT_TRUE(Accepts(g, R"(get_weather", "arguments": {"days": 2}})"));
  EXPECT_TRUE(Accepts(g, R"(search", "arguments": {}})"));
  EXPECT_FALSE(Accepts(g, R"("get_weather", "arguments": {"days": 2}})"));
  EXPECT_FALSE(Accepts(g, R"(get_weather", "arguments": {"days": 2.5}})"));
}

TEST(ToolCallGrammarTest, TheArgumentsOfANamedCallInLlama3Json) {
  auto g = Build({WeatherAndSearch()[0]}, ToolCallStart::kArguments, "parameters");
  EXPECT_TRUE(Accepts(g, R"({"days": 2}})"));
  EXPECT_TRUE(Accepts(g, "{\"days\": 2}\n}"));
  EXPECT_FALSE(Accepts(g, R"({"days": 2})"));  // the call object's own brace is still owed
  auto object = Build(WeatherAndSearch(), ToolCallStart::kObject, "parameters");
  EXPECT_TRUE(Accepts(object, R"({"name": "get_weather", "parameters": {"days": 1}})"));
  EXPECT_FALSE(Accepts(object, R"({"name": "get_weather", "arguments": {"days": 1}})"));
}

TEST(ToolCallGrammarTest, AStrictToolWithoutParametersTakesOnlyAnEmptyObject) {
  auto g = Build({{"ping", Json(), true}}, ToolCallStart::kObject);
  EXPECT_TRUE(Accepts(g, R"({"name": "ping", "arguments": {}})"));
  EXPECT_FALSE(Accepts(g, R"({"name": "ping", "arguments": {"a": 1}})"));
}

TEST(ToolCallGrammarTest, ErrorsNameTheToolAndTheKeyword) {
  ToolCallGrammarOptions options;
  auto g = ToolCallGrammar(
      {{"f", Json::parse(R"j({"type": "object", "properties": {"s": {"type": "string",
                             "pattern": "a(?=b)"}}})j"),
        true}},
      options);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("strict tool 'f'"), std::string_view::npos);
  EXPECT_NE(g.status().message().find("pattern: regex at offset 1: lookahead"),
            std::string_view::npos);
  // The same schema on a tool that is not strict is never compiled.
  EXPECT_TRUE(ToolCallGrammar({{"f", Json::parse(R"({"pattern": 1})"), false}}, options).ok());
  options.start = ToolCallStart::kArguments;
  EXPECT_FALSE(ToolCallGrammar(WeatherAndSearch(), options).ok());
  EXPECT_FALSE(ToolCallGrammar({}, options).ok());
}

}  // namespace
}  // namespace specula::grammar
