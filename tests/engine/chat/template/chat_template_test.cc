// ChatTemplate: the variables a chat template sees (as transformers' apply_chat_template passes
// them), its errors, and concurrent use.
#include "engine/chat/template/chat_template.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/chat/template/test_util.h"

namespace specula {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

std::unique_ptr<ChatTemplate> Make(std::string_view source, ChatTemplateSpecialTokens tokens = {}) {
  ChatTemplateOptions options;
  options.render.now = chat_template_test::FixedNow;
  auto t = ChatTemplate::Create(source, std::move(tokens), options);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::string Render(const ChatTemplate& t, const json& messages, const json& tools = nullptr,
                   const json& kwargs = json::object(), bool add_generation_prompt = false) {
  absl::StatusOr<std::string> out = t.Render(messages, tools, kwargs, add_generation_prompt);
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

const json kHello = json::array({{{"role", "user"}, {"content", "Hello"}}});

TEST(ChatTemplate, UnsupportedConstructsFailAtCreateWithTheirLine) {
  const auto bad = ChatTemplate::Create(
      "{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n"
      "{{ messages|xmlattr }}",
      {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "chat template line 4: unsupported filter 'xmlattr'");
  EXPECT_EQ(ChatTemplate::Create("{% include 'other' %}", {}).status().message(),
            "chat template line 1: unsupported statement 'include'");
  EXPECT_EQ(ChatTemplate::Create("{% if x %}", {}).status().message(),
            "chat template line 1: unexpected end of template, expected 'elif' or 'else' or "
            "'endif'");
}

TEST(ChatTemplate, SeesMessagesToolsDocumentsAndTheGenerationFlag) {
  auto t = Make(
      "{% for m in messages %}[{{ m.role }}:{{ m.content }}{{ ' name=' ~ m.name if m.name }}]"
      "{% endfor %}|tools={{ tools }} {{ tools is defined }} {{ tools is none }}"
      "|documents={{ documents }}|gen={{ add_generation_prompt }}");
  const json messages = {{{"role", "system"}, {"content", "S"}},
                         {{"role", "user"}, {"content", "U"}, {"name", "bob"}}};
  EXPECT_EQ(Render(*t, messages),
            "[system:S][user:U name=bob]|tools=None True True"
            "|documents=None|gen=False");
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  EXPECT_EQ(Render(*t, kHello, tools, json::object(), true),
            "[user:Hello]|tools=[{'type': 'function', 'function': {'name': 'f'}}] True False"
            "|documents=None|gen=True");
}

TEST(ChatTemplate, SpecialTokensTheModelLacksAreUndefined) {
  auto t =
      Make("{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token is defined }}",
           {.bos_token = "<s>", .eos_token = "</s>", .unk_token = "", .pad_token = "<pad>"});
  EXPECT_EQ(Render(*t, kHello), "<s>|</s>|False|True");
}

TEST(ChatTemplate, KwargsAreExtraVariables) {
  auto t = Make(
      "{{ enable_thinking }} {{ enable_thinking is false }} {{ custom }} "
      "{{ messages|length }} {{ add_generation_prompt }} {{ tools }} {{ documents }} "
      "{{ bos_token }}",
      {.bos_token = "<s>", .eos_token = "", .unk_token = "", .pad_token = ""});
  const json kwargs = {{"enable_thinking", false}, {"custom", {{"b", 1.0}, {"a", 0.5}}}};
  EXPECT_EQ(Render(*t, kHello, nullptr, kwargs, true),
            "False True {'b': 1.0, 'a': 0.5} 1 True None None <s>");
}

// transformers lets kwargs replace the special tokens (one field forged 1,000 control tokens) and
// silently drops the others; specula refuses each, naming it, whether or not the model has it.
TEST(ChatTemplate, KwargsMayNotReplaceTheTemplatesOwnVariables) {
  auto t = Make("{{ bos_token }}{{ messages|length }}",
                {.bos_token = "<s>", .eos_token = "", .unk_token = "", .pad_token = ""});
  for (const char* own : {"messages", "tools", "documents", "add_generation_prompt", "bos_token",
                          "eos_token", "unk_token", "pad_token"}) {
    const json kwargs = {{"enable_thinking", true}, {own, "<|eot_id|>"}};
    absl::StatusOr<std::string> out = t->Render(kHello, nullptr, kwargs, true);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << own;
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr(std::string("chat_template_kwargs.") + own + ": the server sets"))
        << own;
  }
}

TEST(ChatTemplate, ToJsonKeepsKeyOrderAndPythonNumbers) {
  auto t = Make("{{ tools|tojson }}|{{ messages[0].tool_calls[0].function.arguments|tojson }}");
  const json tools = json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "required":["z"],"properties":{"z":{"type":"number"},"a":{"type":"string"}}}}}])");
  const json messages = json::parse(
      R"([{"role":"assistant","content":"","tool_calls":[{"type":"function","function":
          {"name":"f","arguments":{"z":1.0,"a":"é","n":null,"small":1e-05,"i":3}}}]}])");
  EXPECT_EQ(
      Render(*t, messages, tools),
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", )"
      R"("required": ["z"], "properties": {"z": {"type": "number"}, "a": {"type": "string"}}}}}])"
      R"(|{"z": 1.0, "a": "é", "n": null, "small": 1e-05, "i": 3})");
}

TEST(ChatTemplate, RaiseExceptionIsInvalidArgumentWithTheMessage) {
  auto t = Make(
      "{% if messages[0].role != 'user' %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/"
      "assistant/...') }}{% endif %}ok");
  const absl::StatusOr<std::string> out =
      t->Render(json::array({{{"role", "assistant"}, {"content", "x"}}}), nullptr, nullptr, false);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_EQ(Render(*t, kHello), "ok");
}

// The template's own failures are the server's (FAILED_PRECONDITION), not the client's
// INVALID_ARGUMENT: only raise_exception speaks for the template against the request.
TEST(ChatTemplate, RuntimeErrorsNameTheLineAndAreTheServers) {
  auto t = Make("{% for m in messages %}\n{{ m.content + 1 }}\n{% endfor %}");
  EXPECT_EQ(Render(*t, kHello),
            "ERROR: chat template line 2: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(t->Render(kHello, nullptr, nullptr, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto u = Make("{{ messages[0].content.strip() }}");
  EXPECT_EQ(Render(*u, json::array()), "ERROR: chat template line 1: list object has no element 0");
}

TEST(ChatTemplate, RejectsMalformedArguments) {
  auto t = Make("x");
  EXPECT_THAT(Render(*t, json::object()), HasSubstr("messages must be a JSON array"));
  EXPECT_THAT(Render(*t, kHello, json::object()), HasSubstr("tools must be a JSON array or null"));
  EXPECT_THAT(Render(*t, kHello, nullptr, json::array()),
              HasSubstr("kwargs must be a JSON object"));
  EXPECT_EQ(Render(*t, kHello, nullptr, nullptr), "x");  // null kwargs: none
}

TEST(ChatTemplate, StrftimeNowWithAFixedClock) {
  auto t = Make("{{- bos_token }}Today Date: {{ strftime_now('%d %b %Y') }}");
  EXPECT_EQ(Render(*t, kHello), "Today Date: 26 Jul 2024");
}

TEST(ChatTemplate, ConcurrentRenders) {
  auto t = Make(
      "{%- set ns = namespace(n=0) %}{%- for m in messages %}{%- set ns.n = ns.n + 1 %}"
      "<|{{ m.role }}|>{{ m.content|trim }}{%- endfor %}#{{ ns.n }}"
      "{%- if add_generation_prompt %}<|assistant|>{% endif %}");
  std::vector<std::thread> threads;
  std::vector<std::string> results(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      json messages = json::array();
      for (int k = 0; k <= i; ++k) {
        messages.push_back(
            {{"role", k % 2 ? "assistant" : "user"}, {"content", " m" + std::to_string(k)}});
      }
      for (int rep = 0; rep < 300; ++rep)
        results[i] = Render(*t, messages, nullptr, nullptr, i % 2);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(results[0], "<|user|>m0#1");
  EXPECT_EQ(results[3], "<|user|>m0<|assistant|>m1<|user|>m2<|assistant|>m3#4<|assistant|>");
}

}  // namespace
}  // namespace specula
