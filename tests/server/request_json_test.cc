// The request JSON parser: the same values nlohmann's own parser builds (key order kept), in
// time linear in the input, and the limits that keep every later use of the value cheap.
#include "server/request_json.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

std::string ObjectWithKeys(size_t n) {
  std::string text = "{";
  for (size_t i = 0; i < n; ++i) absl::StrAppend(&text, i ? "," : "", "\"k", i, "\":", i);
  return text + "}";
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(RequestJson, BuildsWhatNlohmannBuildsKeyOrderKept) {
  for (const char* text :
       {R"({"z": 1, "a": [true, false, null, -5, 18446744073709551615, 1.5e300, "x\u00e9"],
            "m": {"b": {}, "a": [[], [{}]]}, "": ""})",
        R"([])", R"("just a string")", R"(42)", R"(  {"tools": [{"type": "function",
            "function": {"name": "f", "parameters": {"properties": {"y": {}, "x": {}}}}}]} )"}) {
    absl::StatusOr<OrderedJson> got = ParseRequestJson(text, "body");
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    EXPECT_EQ(got->dump(), OrderedJson::parse(text).dump()) << text;
  }
  EXPECT_EQ(ParseRequestJson(R"({"z": 1, "a": 2})", "body")->begin().key(), "z");
}

TEST(RequestJson, NotJsonIsInvalidArgumentNamingWhatAndWhere) {
  for (const char* text : {"", "{", "{\"a\": }", "[1, 2", "{} trailing", "nul", "{\"a\" 1}"}) {
    absl::StatusOr<OrderedJson> got = ParseRequestJson(text, "the request body");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(Message(got.status()), HasSubstr("the request body is not valid JSON")) << text;
  }
  EXPECT_THAT(Message(ParseRequestJson("[1, x]", "b").status()), HasSubstr("at byte 4"));
}

TEST(RequestJson, DepthIsLimitedBeforeTheRestIsRead) {
  EXPECT_TRUE(ParseRequestJson(Nested(kMaxJsonDepth), "body").ok());
  absl::StatusOr<OrderedJson> deep = ParseRequestJson(Nested(kMaxJsonDepth + 1), "body");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(deep.status()), HasSubstr("nests arrays and objects more than 64 deep"));
  // A million levels deep is refused at level 65, not parsed first.
  EXPECT_THAT(Message(ParseRequestJson(Nested(1 << 20), "body").status()),
              HasSubstr("more than 64 deep"));
}

// 60k keys once cost 4.1 s (each insert searched the keys before it); now the number of members
// is capped, and a duplicate is refused rather than silently resolved.
TEST(RequestJson, ObjectsHaveAtMostTheLimitOfDistinctKeys) {
  absl::StatusOr<OrderedJson> at_limit = ParseRequestJson(ObjectWithKeys(kMaxJsonObjectKeys), "b");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->size(), kMaxJsonObjectKeys);
  EXPECT_EQ(std::prev(at_limit->end()).key(), absl::StrCat("k", kMaxJsonObjectKeys - 1));
  absl::StatusOr<OrderedJson> over = ParseRequestJson(ObjectWithKeys(60000), "chat_template_kwargs");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(over.status()),
              HasSubstr("chat_template_kwargs has an object of more than 4096 members"));
  absl::StatusOr<OrderedJson> twice = ParseRequestJson(R"({"a": {"x": 1, "y": 2, "x": 3}})", "b");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(twice.status()), HasSubstr("has the key \"x\" twice in one object"));
  // The same key in different objects is fine.
  EXPECT_TRUE(ParseRequestJson(R"({"x": {"x": 1}, "y": {"x": 2}})", "b").ok());
}

TEST(RequestJson, ArraysHaveAtMostTheLimitOfElements) {
  auto array_of = [](size_t n) {
    std::string text = "[";
    for (size_t i = 0; i < n; ++i) text += i ? ",0" : "0";
    return text + "]";
  };
  absl::StatusOr<OrderedJson> at_limit = ParseRequestJson(array_of(kMaxJsonArrayElements), "b");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->size(), kMaxJsonArrayElements);
  absl::StatusOr<OrderedJson> over = ParseRequestJson(array_of(kMaxJsonArrayElements + 1), "b");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(over.status()), HasSubstr("has an array of more than 1048576 elements"));
}

}  // namespace
}  // namespace specula
