// DetectChatOutputFormat on short realistic template excerpts, PromptEndsInReasoning and
// ParseToolCallSyntax.
#include <gtest/gtest.h>

#include <string>

#include "engine/chat/output/chat_output_parser.h"

namespace specula {
namespace {

// Qwen3: Hermes tool calls and think blocks.
constexpr std::string_view kQwen3Excerpt = R"TPL(
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}
{%- if '</think>' in content %}
    {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)TPL";

// Qwen2.5: Hermes tool calls, no reasoning.
constexpr std::string_view kQwen25Excerpt = R"TPL(
{%- for tool_call in message.tool_calls %}
    {{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
    {{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
)TPL";

// Llama 3.1 with tools.
constexpr std::string_view kLlama31Excerpt = R"TPL(
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
    {{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|python_tag|>' + tool_call.name + '.call(' }}
        {%- else %}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + '}' }}
        {%- endif %}
)TPL";

// Llama 3 (no tools).
constexpr std::string_view kLlama3Plain =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// DeepSeek-R1 distill: only ever strips "...</think>" from history.
constexpr std::string_view kDeepSeekR1Excerpt =
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}";

TEST(DetectChatOutputFormatTest, Qwen3IsHermesWithReasoning) {
  ChatOutputFormat format = DetectChatOutputFormat(kQwen3Excerpt);
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kHermes);
  EXPECT_TRUE(format.reasoning);
  EXPECT_FALSE(format.starts_in_reasoning);
}

TEST(DetectChatOutputFormatTest, Qwen25IsHermesWithoutReasoning) {
  ChatOutputFormat format = DetectChatOutputFormat(kQwen25Excerpt);
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kHermes);
  EXPECT_FALSE(format.reasoning);
}

TEST(DetectChatOutputFormatTest, Llama31IsLlama3Json) {
  ChatOutputFormat format = DetectChatOutputFormat(kLlama31Excerpt);
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kLlama3Json);
  EXPECT_FALSE(format.reasoning);
}

TEST(DetectChatOutputFormatTest, EachLlama31MarkerAloneIsEnough) {
  EXPECT_EQ(DetectChatOutputFormat("{{- '<|python_tag|>' }}").tool_calls,
            ToolCallSyntax::kLlama3Json);
  EXPECT_EQ(DetectChatOutputFormat("{{- \"Environment: ipython\\n\" }}").tool_calls,
            ToolCallSyntax::kLlama3Json);
  EXPECT_EQ(
      DetectChatOutputFormat(
          R"({{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }})")
          .tool_calls,
      ToolCallSyntax::kLlama3Json);
}

TEST(DetectChatOutputFormatTest, HermesWinsOverLlamaMarkers) {
  EXPECT_EQ(DetectChatOutputFormat("Environment: ipython <tool_call>").tool_calls,
            ToolCallSyntax::kHermes);
}

TEST(DetectChatOutputFormatTest, PlainLlama3IsNone) {
  ChatOutputFormat format = DetectChatOutputFormat(kLlama3Plain);
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kNone);
  EXPECT_FALSE(format.reasoning);
}

TEST(DetectChatOutputFormatTest, CloseThinkTagAloneMeansReasoning) {
  ChatOutputFormat format = DetectChatOutputFormat(kDeepSeekR1Excerpt);
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kNone);
  EXPECT_TRUE(format.reasoning);
}

TEST(DetectChatOutputFormatTest, OpenThinkTagAloneMeansReasoning) {
  // QwQ's generation prompt opens the block; its history handling is elsewhere.
  ChatOutputFormat format = DetectChatOutputFormat(
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}");
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kNone);
  EXPECT_TRUE(format.reasoning);
}

TEST(DetectChatOutputFormatTest, EmptyTemplateIsNone) {
  ChatOutputFormat format = DetectChatOutputFormat("");
  EXPECT_EQ(format.tool_calls, ToolCallSyntax::kNone);
  EXPECT_FALSE(format.reasoning);
}

TEST(PromptEndsInReasoningTest, OpenThinkTagAtTheEnd) {
  EXPECT_TRUE(PromptEndsInReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptEndsInReasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(PromptEndsInReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptEndsInReasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(PromptEndsInReasoning(""));
}

TEST(ParseToolCallSyntaxTest, KnownNames) {
  EXPECT_EQ(ParseToolCallSyntax("auto").value(), std::nullopt);
  EXPECT_EQ(ParseToolCallSyntax("none").value(), ToolCallSyntax::kNone);
  EXPECT_EQ(ParseToolCallSyntax("hermes").value(), ToolCallSyntax::kHermes);
  EXPECT_EQ(ParseToolCallSyntax("llama3_json").value(), ToolCallSyntax::kLlama3Json);
}

TEST(ParseToolCallSyntaxTest, UnknownNamesAreInvalidArgument) {
  for (std::string_view name : {"", "Hermes", "llama3", "mistral", "auto "}) {
    absl::StatusOr<std::optional<ToolCallSyntax>> parsed = ParseToolCallSyntax(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace specula
