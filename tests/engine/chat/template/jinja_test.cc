// Unit tests of the Jinja2 interpreter (engine/chat/template/): lexing and whitespace rules,
// parsing and its errors, evaluation of every construct, runtime errors and limits. The expected
// strings are what python3-jinja2 renders (in transformers' environment) for the same input.
#include <string>
#include <thread>
#include <vector>

#include "engine/chat/template/lexer.h"
#include "engine/chat/template/template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/chat/template/test_util.h"

namespace specula::jinja {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<std::string> TryRender(std::string_view source, const json& context = json::object(),
                                      RenderOptions options = {}, ParseOptions parse = {}) {
  auto tmpl = Template::Parse(source, parse);
  if (!tmpl.ok()) return tmpl.status();
  if (!options.now) options.now = chat_template_test::FixedNow;
  return (*tmpl)->Render(context, options);
}

// The rendering, or "ERROR: <message>".
std::string R(std::string_view source, const json& context = json::object()) {
  absl::StatusOr<std::string> out = TryRender(source, context);
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

std::string ParseError(std::string_view source) {
  auto tmpl = Template::Parse(source);
  return tmpl.ok() ? "(parsed)" : std::string(tmpl.status().message());
}

std::string RenderError(std::string_view source, const json& context = json::object(),
                        RenderOptions options = {}) {
  absl::StatusOr<std::string> out = TryRender(source, context, std::move(options));
  return out.ok() ? "(rendered) " + *out : std::string(out.status().message());
}

// ---- lexer

TEST(JinjaLexer, SplitsDataTagsAndOperators) {
  const std::vector<Token> tokens = Tokenize("a{{ x|f(1, 'b') }}{% if y %}", LexerOptions());
  std::vector<std::string> seen;
  for (const Token& t : tokens) seen.push_back(t.value);
  EXPECT_THAT(seen, ::testing::ElementsAre("a", "{{", "x", "|", "f", "(", "1", ",", "b", ")", "}}",
                                           "{%", "if", "y", "%}", ""));
  EXPECT_EQ(tokens[6].type, TokenType::kInteger);
  EXPECT_EQ(tokens[6].int_value, 1);
  EXPECT_EQ(tokens[8].type, TokenType::kString);
  EXPECT_EQ(tokens.back().type, TokenType::kEof);
}

TEST(JinjaLexer, NumbersAndStrings) {
  EXPECT_EQ(R("{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 2.5e1 }} {{ 1e3 }}"),
            "1000 31 15 5 25.0 1000.0");
  EXPECT_EQ(R(R"({{ 'a\tb' }}|{{ "q\"q" }}|{{ '\x41\u00e9' }}|{{ '\d' }}|{{ 'ad' "j" }})"),
            "a\tb|q\"q|A\xC3\xA9|\\d|adj");
  EXPECT_EQ(R("{{ xs.0.1 }}", {{"xs", {{7, 8}}}}), "8");  // `.0.1` is not the float 0.1
}

TEST(JinjaLexer, LineNumbersCountNewlines) {
  const std::vector<Token> tokens = Tokenize("a\nb{{\nx }}", LexerOptions());
  EXPECT_EQ(tokens[0].line, 1);
  EXPECT_EQ(tokens[1].line, 2);  // {{
  EXPECT_EQ(tokens[2].line, 3);  // x
}

TEST(JinjaLexer, Errors) {
  EXPECT_EQ(ParseError("{{ 'abc }}"), "template line 1: unexpected char ''' at 3");
  EXPECT_EQ(ParseError("\n{{ a ? b }}"), "template line 2: unexpected char '?' at 6");
  EXPECT_EQ(ParseError("{# never closed"), "template line 1: Missing end of comment tag");
  EXPECT_EQ(ParseError("{% raw %}x"), "template line 1: Missing end of raw directive");
  EXPECT_EQ(ParseError("{{ (1 }}"), "template line 1: unexpected '}', expected ')'");
  EXPECT_EQ(ParseError("{{ 1 ]}}"), "template line 1: unexpected ']'");
  EXPECT_EQ(ParseError("{{ x"), "template line 1: unexpected end of template, expected '}}'");
  EXPECT_EQ(ParseError("ok\xff"), "template: the template is not valid UTF-8");
}

// ---- whitespace control

TEST(JinjaWhitespace, MinusStripsAllWhitespaceOnThatSide) {
  EXPECT_EQ(R("a  \n {{- 'x' -}} \n  b"), "axb");
  EXPECT_EQ(R("a\n  {%- if true -%}\n  b\n  {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(R("a  {#- comment -#}  b"), "ab");
}

TEST(JinjaWhitespace, TrimBlocksRemovesTheNewlineAfterABlockTag) {
  EXPECT_EQ(R("{% if true %}\nyes\n{% endif %}\ndone"), "yes\ndone");
  EXPECT_EQ(R("{# c #}\nx"), "x");
  EXPECT_EQ(R("{{ 'v' }}\nx"), "v\nx");                 // not after variables
  EXPECT_EQ(R("{% if true +%}\nx{% endif %}"), "\nx");  // `+%}` keeps it
}

TEST(JinjaWhitespace, LstripBlocksRemovesIndentationBeforeABlockTag) {
  EXPECT_EQ(R("start\n    {% if true %}\n    inner\n    {% endif %}\nend"),
            "start\n    inner\nend");
  EXPECT_EQ(R("a\n \t {% if true %}b{% endif %}"), "a\nb");
  EXPECT_EQ(R("text {% if true %}x{% endif %}"), "text x");  // not after text
  EXPECT_EQ(R("a\n    {{ 'v' }}"), "a\n    v");              // not before variables
  EXPECT_EQ(R("    {%+ if true %}x{% endif %}"), "    x");   // `{%+` keeps it
  EXPECT_EQ(R("{% for x in [1] %}\n  {% if x %}\n  [{{ x }}]\n  {% endif %}\n{% endfor %}"),
            "  [1]\n");
}

TEST(JinjaWhitespace, PlainJinjaDefaultsWhenTurnedOff) {
  ParseOptions parse;
  parse.lexer.trim_blocks = false;
  parse.lexer.lstrip_blocks = false;
  parse.lexer.keep_trailing_newline = true;
  EXPECT_EQ(*TryRender("  {% if true %}\nx\n{% endif %}\n", json::object(), {}, parse),
            "  \nx\n\n");
}

TEST(JinjaWhitespace, TrailingNewlineAndCrlf) {
  EXPECT_EQ(R("a\n"), "a");
  EXPECT_EQ(R("a\n\n"), "a\n");
  EXPECT_EQ(R("a\r\nb\rc\r\n"), "a\nb\nc");
  EXPECT_EQ(R("{{ 'x\r\ny' }}"), "x\ny");
}

TEST(JinjaWhitespace, RawBlocks) {
  EXPECT_EQ(R("{% raw %}{{ not evaluated }}{% if %}{% endraw %}"), "{{ not evaluated }}{% if %}");
  EXPECT_EQ(R("{% raw %}\nx\n  {% endraw %}\ny"), "\nx\ny");  // lstrip and trim apply to endraw
  EXPECT_EQ(R("a  {%- raw -%}  b  {%- endraw -%}  c"), "abc");
}

// ---- statements

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %}";
  EXPECT_EQ(R(t, {{"v", 1}}), "one");
  EXPECT_EQ(R(t, {{"v", 2}}), "two");
  EXPECT_EQ(R(t, {{"v", 3}}), "other");
  EXPECT_EQ(R("{% for v in [0, 1, '', 'x', [], [0], {}, none, 0.0, missing] %}"
              "{{ 'T' if v else 'F' }}{% endfor %}"),
            "FTFTFTFFFF");
}

TEST(JinjaStatements, ForLoops) {
  const json ctx = {{"xs", {1, 2, 3}}, {"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(R("{% for x in xs %}{{ x }},{% endfor %}", ctx), "1,2,3,");
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(R("{% for k in d %}{{ k }}{% endfor %}", ctx), "ba");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("[{% for x in missing %}{{ x }}{% endfor %}]"), "[]");
  EXPECT_EQ(
      R("{% for x in xs if x != 2 %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %}", ctx),
      "1:1/2 2:3/2 ");
  EXPECT_EQ(R("{% for c in 'h\xC3\xA9' %}[{{ c }}]{% endfor %}"), "[h][\xC3\xA9]");
}

TEST(JinjaStatements, LoopVariable) {
  EXPECT_EQ(R("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
              "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}"),
            "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"),
            "-2;1-3;2-;");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
  EXPECT_EQ(R("{% for x in [1, 1, 2] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}"),
            "12");
  EXPECT_EQ(R("{% for a in [1, 2] %}{% set outer = loop %}{% for b in [1, 2] %}"
              "{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}"),
            "11 12 21 22 ");
}

TEST(JinjaStatements, BreakAndContinue) {
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for a in [1, 2] %}{% for b in [1, 2, 3] %}{% if b == 2 %}{% break %}{% endif %}"
              "{{ a }}{{ b }} {% endfor %}{% endfor %}"),
            "11 21 ");
}

TEST(JinjaStatements, ScopingFollowsJinja) {
  // A loop iteration is a scope of its own, fresh each time; `if` is not a scope.
  EXPECT_EQ(
      R("{% set x = 0 %}{% for i in [1, 2, 3] %}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}"),
      "1,2,3,0");
  EXPECT_EQ(
      R("{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}"),
      "[]");
  EXPECT_EQ(R("{% if true %}{% set z = 3 %}{% endif %}{{ z }}"), "3");
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}"
              "{% endfor %}{{ ns.n }}"),
            "6");
}

TEST(JinjaStatements, SetForms) {
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = ['x', 'y'] %}{{ c }}{{ d }}"),
            "12xy");
  EXPECT_EQ(R("{% set block %}Hi {{ 'you' }}{% endset %}[{{ block }}]"), "[Hi you]");
  EXPECT_EQ(R("{% set block | upper | trim %}  hi  {% endset %}[{{ block }}]"), "[HI]");
  EXPECT_EQ(R("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}"),
            "12False");
  EXPECT_EQ(RenderError("{% set d = {} %}{% set d.x = 1 %}"),
            "template line 1: cannot assign attribute on non-namespace object");
}

TEST(JinjaStatements, Macros) {
  EXPECT_EQ(R("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
              "{{ greet('Bob') }} {{ greet('Ann', greeting='Hi') }} {{ greet(name='Zed') }}"),
            "Hello, Bob! Hi, Ann! Hello, Zed!");
  EXPECT_EQ(R("{% macro m(a, b) %}[{{ a }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}"),
            "[1][False]");
  EXPECT_EQ(
      R("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}"),
      "1(2, 3){'k': 4}");
  EXPECT_EQ(R("{% macro f(n) %}{% if n <= 1 %}1{% else %}{{ n * f(n - 1)|int }}{% endif %}"
              "{% endmacro %}{{ f(5) }}"),
            "120");
  EXPECT_EQ(R("{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}"), "2");
  EXPECT_EQ(R("{% macro m() %}[{{ y }}]{% endmacro %}{% for y in [1] %}{{ m() }}{% endfor %}"),
            "[]");
  EXPECT_EQ(RenderError("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
            "template line 1: macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(RenderError("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}"),
            "template line 1: macro 'm' takes no keyword argument 'b'");
}

TEST(JinjaStatements, FilterWithGenerationAndPrintBlocks) {
  EXPECT_EQ(R("{% filter upper %}hi {{ 'you' }}{% endfilter %}"), "HI YOU");
  EXPECT_EQ(R("{% filter trim|replace('a', 'b') %}  banana  {% endfilter %}"), "bbnbnb");
  EXPECT_EQ(R("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}"), "211");
  EXPECT_EQ(R("{% for x in [1, 2] %}{% generation %}[{{ x }}]{% set inner = 1 %}"
              "{% endgeneration %}{% endfor %}{{ inner is defined }}"),
            "[1][2]False");
  EXPECT_EQ(R("{% print 'a', 'b' %}"), "ab");
}

// ---- expressions

TEST(JinjaExpressions, PrintsValuesAsPythonStr) {
  EXPECT_EQ(R("{{ 1.0 }} {{ 0.5 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ -0.0 }}"),
            "1.0 0.5 1e-05 1e+16 1000000000000000.0 0.30000000000000004 -0.0");
  EXPECT_EQ(R("{{ true }} {{ none }} {{ [1, 'a', none, true, \"it's\"] }} {{ {'a': (1,)} }}"),
            "True None [1, 'a', None, True, \"it's\"] {'a': (1,)}");
  EXPECT_EQ(R("{{ ['a\\nb', '\\x00', '\\u00a0', '\xC3\xA9'] }}"),
            "['a\\nb', '\\x00', '\\xa0', '\xC3\xA9']");
  EXPECT_EQ(R("[{{ missing }}][{{ d.missing }}]", {{"d", json::object()}}), "[][]");
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(R("{{ 1 + 2 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} "
              "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ -7.5 % 2 }} {{ true + 1 }} {{ 3 * 1.5 }}"),
            "3 3.5 2.0 3 -4 2 1024 0.5 0.5 2 4.5");
  EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 2 ~ 3 * 4 }} {{ 10 - 2 - 3 }}"),
            "7 4 64 212 5");
  EXPECT_EQ(
      R("{{ 'ab' + 'cd' }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }}"),
      "abcd abab [1, 1, 1] [1, 2] a1None");
  EXPECT_EQ(RenderError("{{ 'a' + 1 }}"),
            "template line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(RenderError("{{ 1 / 0 }}"), "template line 1: division by zero");
  EXPECT_EQ(RenderError("{{ 9223372036854775807 + 1 }}"), "template line 1: integer overflow");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} "
              "{{ (1,) == [1] }} {{ missing == missing }}"),
            "True False True True True False True");
  EXPECT_EQ(R("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'z' not in 'abc' }} "
              "{{ 'x' in missing }}"),
            "True True True True False");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 2 }} {{ 0 and 2 }} {{ not 0 }} {{ not missing }}"),
            "x 2 0 True True");
  EXPECT_EQ(R("{{ 'y' if true else 'n' }} [{{ 'only' if false }}] {{ 'a' if false else 'b' }}"),
            "y [] b");
  EXPECT_EQ(RenderError("{{ 1 < 'a' }}"),
            "template line 1: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(RenderError("{{ 1 in 'abc' }}"),
            "template line 1: 'in <string>' requires string as left operand, not int");
}

TEST(JinjaExpressions, AttributesSubscriptsAndSlices) {
  const json ctx = {{"u", {{"name", "Bob"}, {"tags", {"x", "y"}}}}, {"xs", {1, 2, 3}}};
  EXPECT_EQ(R("{{ u.name }} {{ u['name'] }} {{ u.tags[1] }} {{ u.tags.0 }} {{ xs[-1] }}", ctx),
            "Bob Bob y x 3");
  EXPECT_EQ(R("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[5:] }} "
              "{{ 'h\xC3\xA9llo'[1:3] }} {{ 'h\xC3\xA9llo'[::-1] }} {{ 'h\xC3\xA9llo'[1] }}",
              ctx),
            "[2, 3] [1, 2] [3, 2, 1] [1, 3] [] \xC3\xA9l oll\xC3\xA9h \xC3\xA9");
  // Dict methods win over keys with `.`, keys win with `[]` (Jinja's getattr/getitem order).
  EXPECT_EQ(R("{{ m['items'] }} {{ m.items()|length }}", {{"m", {{"items", "I"}}}}), "I 1");
  EXPECT_EQ(R("[{{ xs[10] }}][{{ none.x }}][{{ xs.foo }}]", ctx), "[][][]");
  EXPECT_EQ(RenderError("{{ missing.attr }}"), "template line 1: 'missing' is undefined");
  EXPECT_EQ(RenderError("{{ missing.attr is defined }}"),
            "template line 1: 'missing' is undefined");
  EXPECT_EQ(RenderError("{{ u.nope.x }}", ctx),
            "template line 1: 'dict object' has no attribute 'nope'");
}

TEST(JinjaExpressions, Literals) {
  EXPECT_EQ(
      R("{{ [1, [2, 3], {'k': 'v'}][2].k }} {{ {'a': 1, 'a': 2} }} {{ [1, 2, ] }} {{ (1, 2) }}"),
      "v {'a': 2} [1, 2] (1, 2)");
  EXPECT_EQ(R("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");  // `}}` inside braces is not the end
}

// ---- filters

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(R("{{ 'hELLO wORLD'|capitalize }} {{ 'hello world-wide (x)'|title }} "
              "{{ 'Hi'|upper }} {{ 'Hi'|lower }} {{ 'straße'|upper }}"),
            "Hello world Hello World-Wide (X) HI hi STRASSE");
  EXPECT_EQ(R("[{{ '  a b  '|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ none|trim }}]"),
            "[a b] [a] [None]");
  EXPECT_EQ(R("{{ 'aaa'|replace('a', 'b', 2) }} {{ 'foo bar baz qux'|truncate(9) }} "
              "{{ 'a b, c_d 42'|wordcount }} [{{ 'ab'|center(6) }}]"),
            "bba foo... 4 [  ab  ]");
  EXPECT_EQ(R("{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}"),
            "a\n    b\n\n    c|  a\n  b");
  EXPECT_EQ(R("{{ 5|string }} {{ '<b>'|safe }}"), "5 <b>");
}

TEST(JinjaFilters, DefaultAndConversions) {
  EXPECT_EQ(R("{{ missing|default('d') }} {{ missing|d('d2') }} {{ none|default('x') }} "
              "{{ ''|default('e', true) }}"),
            "d d2 None e");
  EXPECT_EQ(
      R("{{ '42'|int }} {{ '42.9'|int }} {{ 3.99|int }} {{ 'x'|int(7) }} {{ 'ff'|int(base=16) }}"),
      "42 42 3 7 255");
  EXPECT_EQ(R("{{ '3.5'|float }} {{ 3|float }} {{ 'abc'|float }} {{ 2.5|round }} {{ 3.5|round }} "
              "{{ 2.675|round(2) }} {{ 5|round }} {{ 42.55|round(1, 'floor') }} {{ -3|abs }}"),
            "3.5 3.0 0.0 2.0 4.0 2.67 5 42.5 3");
}

TEST(JinjaFilters, Sequences) {
  const json ctx = {{"xs", {3, 1, 2}},
                    {"words", {"banana", "Apple", "cherry", "apple"}},
                    {"users",
                     {{{"name", "Bob"}, {"age", 30}},
                      {{"name", "alice"}, {"age", 25}},
                      {{"name", "Carol"}, {"age", 30}, {"email", "c@x"}}}}};
  EXPECT_EQ(R("{{ xs|first }} {{ xs|last }} {{ xs|length }} {{ xs|count }} {{ xs|sum }} "
              "{{ xs|min }} {{ xs|max }} {{ xs|list }} {{ xs|reverse|list }} {{ xs|join('-') }}",
              ctx),
            "3 2 3 3 6 1 3 [3, 1, 2] [2, 1, 3] 3-1-2");
  EXPECT_EQ(R("{{ words|sort }} {{ words|sort(reverse=true) }} {{ words|unique|list }}", ctx),
            "['Apple', 'apple', 'banana', 'cherry'] ['cherry', 'banana', 'Apple', 'apple'] "
            "['banana', 'Apple', 'cherry']");
  EXPECT_EQ(
      R("{{ users|map(attribute='name')|join(', ') }} | "
        "{{ users|sort(attribute='age,name')|map(attribute='name')|list }} | "
        "{{ users|selectattr('email')|map(attribute='name')|list }} | "
        "{{ users|rejectattr('age', 'gt', 26)|map(attribute='name')|list }} | "
        "{{ users|sum(attribute='age') }} | {{ users|join(',', attribute='age') }}",
        ctx),
      "Bob, alice, Carol | ['alice', 'Bob', 'Carol'] | ['Carol'] | ['alice'] | 85 | 30,25,30");
  EXPECT_EQ(R("{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ xs|map('string')|list }} "
              "{{ [0, 1, '']|select|list }}",
              ctx),
            "[3, 1] [2] ['3', '1', '2'] [1]");
  EXPECT_EQ(
      R("{{ {'b': 1, 'A': 3}|dictsort }} {{ {'b': 1}|items|list }} {{ [1, 2, 3]|batch(2)|list }}"),
      "[('A', 3), ('b', 1)] [('b', 1)] [[1, 2], [3]]");
}

TEST(JinjaFilters, ToJsonIsPythonJsonDumps) {
  EXPECT_EQ(R("{{ {'b': 1, 'a': [1.0, 0.5, 1e-05, none, true, '\xC3\xA9', 'q\"\\n']}|tojson }}"),
            "{\"b\": 1, \"a\": [1.0, 0.5, 1e-05, null, true, \"\xC3\xA9\", \"q\\\"\\n\"]}");
  EXPECT_EQ(R("{{ {'a': [1, {}], 'c': []}|tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"c\": []\n}");
  EXPECT_EQ(
      R("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ '\xC3\xA9'|tojson(ensure_ascii=true) }} "
        "{{ [1, 2]|tojson(separators=(',', ':')) }}"),
      "{\"a\": 2, \"b\": 1} \"\\u00e9\" [1,2]");
  // transformers' tojson takes ensure_ascii first: tojson(2) is not an indent.
  EXPECT_EQ(R("{{ [1]|tojson(2) }}"), "[1]");
  EXPECT_EQ(RenderError("{{ missing|tojson }}"),
            "template line 1: Object of type Undefined is not JSON serializable");
}

// ---- tests, globals, methods

TEST(JinjaTests, TypeAndValueTests) {
  EXPECT_EQ(R("{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}"
              "{{ 1.0 is float }}{{ 'a' is string }}{{ {} is mapping }}{{ true is boolean }}"
              "{{ false is false }}{{ 0 is false }}{{ true is true }}"),
            "TrueTrueTrueFalseTrueTrueTrueTrueTrueFalseTrue");
  EXPECT_EQ(R("{{ missing is defined }}{{ missing is undefined }}{{ none is none }}"
              "{{ none is not none }}{{ [] is iterable }}{{ 1 is iterable }}{{ 's' is sequence }}"),
            "FalseTrueTrueFalseTrueFalseTrue");
  EXPECT_EQ(
      R("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}"
        "{{ 1 is eq 1 }}{{ 1 is ne 1 }}{{ 1 is lt 2 }}{{ 2 is ge 3 }}{{ 2 is in [1, 2] }}"
        "{{ 'ab' is lower }}{{ 'AB' is upper }}{{ none is sameas none }}{{ 'upper' is filter }}"
        "{{ 'odd' is test }}{{ range is callable }}"),
      "TrueTrueTrueFalseTrueFalseTrueFalseTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaGlobals, RangeDictCyclerJoiner) {
  EXPECT_EQ(R("{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -4)|list }}"),
            "[0, 1, 2] [1, 2, 3] [10, 6, 2]");
  EXPECT_EQ(R("{{ dict(a=1) }} {{ dict([('k', 'v')]) }}"), "{'a': 1} {'k': 'v'}");
  EXPECT_EQ(R("{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}"
              "{% set j = joiner('|') %}{% for x in [1, 2] %}{{ j() }}{{ x }}{% endfor %}"),
            "aba1|2");
  EXPECT_EQ(RenderError("{{ range(200000)|length }}"),
            "template line 1: Range too big. The sandbox blocks ranges larger than MAX_RANGE "
            "(100000).");
}

TEST(JinjaGlobals, RaiseExceptionGivesItsMessageAsIs) {
  const absl::StatusOr<std::string> out = TryRender(
      "line 1\n{% if true %}{{ raise_exception('Roles must alternate! ' ~ 2) }}{% endif %}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Roles must alternate! 2");
}

TEST(JinjaGlobals, StrftimeNowUsesTheInjectedClock) {
  EXPECT_EQ(R("{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }} "
              "{{ strftime_now('%A %j') }} {{ strftime_now('%f') }}[{{ strftime_now('%z%Z') }}]"),
            "2024-07-26 10:30:15 26 Jul 2024 Friday 208 250000[]");
  // The default clock is the current local time.
  auto tmpl = Template::Parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(tmpl.ok());
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  EXPECT_EQ(*(*tmpl)->Render(json::object()), std::to_string(1900 + tm.tm_year));
}

TEST(JinjaMethods, StringMethods) {
  EXPECT_EQ(R("[{{ '  a '.strip() }}][{{ '\\n\\nab\\n'.strip('\\n') }}][{{ 'xa'.lstrip('x') }}]"
              "[{{ 'ax '.rstrip() }}]"),
            "[a][ab][a][ax]");
  EXPECT_EQ(
      R("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} "
        "{{ 'a,b,c'.rsplit(',', 1) }} {{ 'x</t>y'.split('</t>')[-1] }} {{ 'a\\nb'.splitlines() }}"),
      "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c'] y ['a', 'b']");
  EXPECT_EQ(R("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}"
              "{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}"
              "{{ 'a-b'.replace('-', '+') }}{{ ', '.join(['x', 'y']) }}{{ 'ab'.upper() }}"
              "{{ '12'.isdigit() }}{{ 'hello world'.title() }}"),
            "TrueTrue232a+bx, yABTrueHello World");
}

TEST(JinjaMethods, DictAndListMethods) {
  const json ctx = {{"d", {{"b", 1}, {"a", 2}}}, {"xs", {1, 2, 2}}};
  EXPECT_EQ(R("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys()|list }} "
              "{{ d.values()|list }} {{ d.items()|list }} {{ xs.index(2) }} {{ xs.count(2) }}",
              ctx),
            "2 None 0 ['b', 'a'] [1, 2] [('b', 1), ('a', 2)] 1 2");
}

TEST(JinjaMethods, MutatingMethodsAreRefusedAsInTheSandbox) {
  EXPECT_EQ(RenderError("{% set l = [] %}{{ l.append(1) }}"),
            "template line 1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(RenderError("{{ d.update({}) }}", {{"d", json::object()}}),
            "template line 1: access to attribute 'update' of 'dict' object is unsafe.");
  EXPECT_EQ(R("{{ [].append is defined }}"), "False");
}

// ---- parse-time errors: unsupported constructs fail at Parse, naming construct and line

TEST(JinjaParseErrors, UnsupportedConstructsNameTheConstructAndLine) {
  EXPECT_EQ(ParseError("a\nb\n{{ x|xmlattr }}"), "template line 3: unsupported filter 'xmlattr'");
  EXPECT_EQ(ParseError("{% if x is escapedx %}{% endif %}"),
            "template line 1: unsupported test 'escapedx'");
  EXPECT_EQ(ParseError("\n{% include 'x.html' %}"),
            "template line 2: unsupported statement 'include'");
  EXPECT_EQ(ParseError("{% extends 'base' %}"), "template line 1: unsupported statement 'extends'");
  EXPECT_EQ(ParseError("{% call m() %}{% endcall %}"),
            "template line 1: unsupported statement 'call'");
  EXPECT_EQ(ParseError("{% do x %}"), "template line 1: unsupported statement 'do'");
  EXPECT_EQ(ParseError("{{ '{}'.format(1) }}"), "template line 1: unsupported method 'format'");
  EXPECT_EQ(ParseError("{{ lipsum() }}"), "template line 1: unsupported function 'lipsum'");
  EXPECT_EQ(ParseError("{{ xs|map('nofilter') }}"),
            "template line 1: unsupported filter 'nofilter'");
  EXPECT_EQ(ParseError("{{ xs|select('notest') }}"), "template line 1: unsupported test 'notest'");
  EXPECT_EQ(ParseError("{% for x in xs recursive %}{% endfor %}"),
            "template line 1: unsupported: recursive for loops");
  // Calling a macro defined anywhere, or a bound name, is fine.
  EXPECT_EQ(ParseError("{{ m() }}{% macro m() %}{% endmacro %}{% set f = m %}{{ f() }}"),
            "(parsed)");
}

TEST(JinjaParseErrors, SyntaxErrors) {
  EXPECT_EQ(ParseError("{% for x in xs %}"),
            "template line 1: unexpected end of template, expected 'endfor' or 'else'");
  EXPECT_EQ(ParseError("{% for x in xs %}\n{% endif %}"),
            "template line 2: unexpected 'endif' (expected 'endfor' or 'else')");
  EXPECT_EQ(ParseError("{% break %}"), "template line 1: 'break' outside loop");
  EXPECT_EQ(ParseError("{% macro m(a=1, b) %}{% endmacro %}"),
            "template line 1: non-default argument follows default argument");
  EXPECT_EQ(ParseError("{{ }}"),
            "template line 1: expected an expression, got end of print statement");
  EXPECT_EQ(ParseError("{% set 1 = 2 %}"), "template line 1: can't assign to this expression");
  EXPECT_EQ(ParseError("{% %}"), "template line 1: tag name expected");
  EXPECT_EQ(ParseError("{{ x is defined is none }}"),
            "template line 1: You cannot chain multiple tests with is");
}

// ---- limits

TEST(JinjaLimits, DeepNestingIsASyntaxError) {
  EXPECT_THAT(ParseError("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"),
              HasSubstr("template nested deeper than 100 levels"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_THAT(ParseError(chain + " }}"), HasSubstr("template nested deeper than"));
}

TEST(JinjaLimits, RecursionDepth) {
  EXPECT_THAT(RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              HasSubstr("maximum recursion depth exceeded"));
}

TEST(JinjaLimits, OutputAndValueSizes) {
  RenderOptions small;
  small.max_output_bytes = 1000;
  EXPECT_THAT(RenderError("{% for i in range(2000) %}x{% endfor %}", json::object(), small),
              HasSubstr("output larger than the limit of 1000 bytes"));
  EXPECT_THAT(RenderError("{{ 'x' * 5000 }}", json::object(), small),
              HasSubstr("larger than the limit"));
  EXPECT_THAT(RenderError("{% set ns = namespace(s='xx') %}{% for i in range(20) %}"
                          "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                          json::object(), small),
              HasSubstr("larger than the limit"));
  RenderOptions few;
  few.max_loop_iterations = 100;
  EXPECT_THAT(
      RenderError("{% for i in range(50) %}{% for j in range(50) %}{% endfor %}{% endfor %}",
                  json::object(), few),
      HasSubstr("more than 100 loop iterations"));
}

TEST(JinjaLimits, NestingOfValues) {
  EXPECT_THAT(RenderError("{% set ns = namespace(v=[]) %}{% for i in range(1000) %}"
                          "{% set ns.v = [ns.v] %}{% endfor %}"),
              HasSubstr("nest deeper than 256 levels"));
  EXPECT_THAT(RenderError("{% set ns = namespace(v=none) %}{% for i in range(1000) %}"
                          "{% set ns.v = namespace(p=ns.v) %}{% endfor %}"),
              HasSubstr("nest deeper than 256 levels"));
  // A namespace holding itself is fine, and freed after the render.
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"), "True");
  json deep = 1;
  for (int i = 0; i < 300; ++i) deep = json::array({deep});
  EXPECT_THAT(RenderError("{{ x }}", {{"x", deep}}), HasSubstr("JSON input nests deeper"));
}

TEST(JinjaLimits, InvalidUtf8Input) {
  EXPECT_THAT(RenderError("{{ x }}", {{"x", std::string("bad\xff")}}),
              HasSubstr("not valid UTF-8"));
}

// ---- errors carry the line of the failing expression

TEST(JinjaRuntimeErrors, NameTheLine) {
  EXPECT_EQ(RenderError("ok\n{% for x in xs %}\n{{ x + 'a' }}\n{% endfor %}", {{"xs", {1}}}),
            "template line 3: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(RenderError("\n\n{{ n|length }}", {{"n", nullptr}}),
            "template line 3: object of type 'NoneType' has no len()");
  ParseOptions named;
  named.name = "chat template";
  EXPECT_EQ(TryRender("{{ 1 // 0 }}", json::object(), {}, named).status().message(),
            "chat template line 1: integer division or modulo by zero");
}

// ---- Render is const and thread-safe

TEST(JinjaTemplate, ConcurrentRendersOfOneTemplate) {
  auto tmpl = Template::Parse(
      "{% set ns = namespace(total=0) %}{% for x in xs %}{% set ns.total = ns.total + x %}"
      "{{ x|string|upper }}{% endfor %}={{ ns.total }} {{ strftime_now('%Y') }}");
  ASSERT_TRUE(tmpl.ok());
  RenderOptions options;
  options.now = chat_template_test::FixedNow;
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      json ctx = {{"xs", json::array()}};
      for (int i = 0; i <= t; ++i) ctx["xs"].push_back(i);
      for (int rep = 0; rep < 200; ++rep) {
        absl::StatusOr<std::string> out = (*tmpl)->Render(ctx, options);
        results[t] = out.ok() ? *out : "error";
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(results[0], "0=0 2024");
  EXPECT_EQ(results[3], "0123=6 2024");
  EXPECT_EQ(results[7], "01234567=28 2024");
}

}  // namespace
}  // namespace specula::jinja
