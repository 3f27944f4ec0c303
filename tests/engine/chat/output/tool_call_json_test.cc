// The internal helpers: tag-prefix hold-back, JSON object boundaries, call objects.
#include "engine/chat/output/tool_call_json.h"

#include <gtest/gtest.h>

#include "engine/chat/output/llama3_json_tool_call_parser.h"
#include "engine/chat/output/text_scan.h"
#include "tests/engine/chat/output/chat_output_test_util.h"

namespace specula::chat_output_internal {
namespace {

using chat_output_testing::Call;

TEST(TextScanTest, PartialTagLength) {
  EXPECT_EQ(PartialTagLength("abc <tool_", "<tool_call>"), 6u);
  EXPECT_EQ(PartialTagLength("abc <", "<tool_call>"), 1u);
  EXPECT_EQ(PartialTagLength("abc", "<tool_call>"), 0u);
  EXPECT_EQ(PartialTagLength("<tool_call>", "<tool_call>"), 0u);  // whole tags are found, not held
  EXPECT_EQ(PartialTagLength("<tool_call", "<tool_call>"), 10u);
  EXPECT_EQ(PartialTagLength("", "<tool_call>"), 0u);
  EXPECT_EQ(PartialTagLength("<<", "<think>"), 1u);
}

TEST(TextScanTest, StripNewlines) {
  EXPECT_EQ(StripLeadingNewlines("\n\n a\n"), " a\n");
  EXPECT_EQ(StripTrailingNewlines("\n a \n\n"), "\n a ");
  EXPECT_EQ(StripLeadingNewlines("\n\n"), "");
  EXPECT_EQ(StripTrailingNewlines("\n\n"), "");
}

TEST(FindJsonObjectEndTest, MatchesBracesOutsideStrings) {
  EXPECT_EQ(FindJsonObjectEnd("{}", 0), 2u);
  EXPECT_EQ(FindJsonObjectEnd(R"({"a": {"b": [1, {}]}}; x)", 0), 21u);
  EXPECT_EQ(FindJsonObjectEnd(R"({"a": "}{\"}"} tail)", 0), 14u);
  EXPECT_EQ(FindJsonObjectEnd(R"(x {"a": "\\"} y)", 2), 13u);
  EXPECT_EQ(FindJsonObjectEnd(R"({"a": {)", 0), std::string_view::npos);
  EXPECT_EQ(FindJsonObjectEnd(R"({"a": "})", 0), std::string_view::npos);
}

TEST(ParseToolCallJsonTest, RequireArgumentsRejectsBareNames) {
  EXPECT_EQ(ParseToolCallJson(R"({"name": "f"})", {.require_arguments = false}), Call("f", "{}"));
  EXPECT_EQ(ParseToolCallJson(R"({"name": "f"})", {.require_arguments = true}), std::nullopt);
}

TEST(ParseToolCallJsonTest, ArgumentsWinOverParameters) {
  EXPECT_EQ(
      ParseToolCallJson(R"({"name": "f", "parameters": {"p": 1}, "arguments": {"a": 2}})", {}),
      Call("f", R"({"a":2})"));
}

TEST(ParseToolCallJsonTest, ExtraKeysAreIgnored) {
  EXPECT_EQ(ParseToolCallJson(R"({"type": "function", "name": "f", "parameters": {"x": []}})", {}),
            Call("f", R"({"x":[]})"));
}

TEST(ParseToolCallJsonTest, RejectsInvalidUtf8) {
  EXPECT_EQ(ParseToolCallJson("{\"name\": \"f\", \"arguments\": {\"a\": \"\xff\"}}", {}),
            std::nullopt);
}

TEST(ParseLlama3JsonToolCallsTest, Sequences) {
  EXPECT_EQ(
      ParseLlama3JsonToolCalls(R"( {"name":"a","parameters":{}} ; {"name":"b","arguments":{}} ; )")
          ->size(),
      2u);
  EXPECT_EQ(ParseLlama3JsonToolCalls(""), std::nullopt);
  EXPECT_EQ(ParseLlama3JsonToolCalls("<|python_tag|>"), std::nullopt);
  EXPECT_EQ(ParseLlama3JsonToolCalls(";"), std::nullopt);
  EXPECT_EQ(ParseLlama3JsonToolCalls(R"({"name":"a","parameters":{}};;)"), std::nullopt);
}

}  // namespace
}  // namespace specula::chat_output_internal
