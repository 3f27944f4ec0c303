// The JSON Schema compiler: texts its grammar accepts and refuses for each supported keyword, and
// the errors for what it does not support (named, never ignored). tools' sample check
// (json_schema_samples_test) validates random sentences with Python's jsonschema on top.
#include "engine/grammar/json_schema.h"

#include <string>
#include <vector>

#include "engine/grammar/json_rules.h"
#include "engine/grammar/matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

struct Case {
  const char* schema;
  std::vector<std::string> accepted;
  std::vector<std::string> refused;
};

// `schema` is refused (INVALID_ARGUMENT) with a message holding `message`.
void ExpectRefused(const char* schema, const char* message) {
  auto g = CompileJsonSchema(Json::parse(schema));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << schema;
  EXPECT_THAT(g.status().message(), HasSubstr(message)) << schema;
}

void ExpectRefused(const std::vector<std::pair<const char*, const char*>>& cases) {
  for (const auto& [schema, message] : cases) ExpectRefused(schema, message);
}

void Check(const Case& c, const JsonSchemaOptions& options = {}) {
  auto g = CompileJsonSchema(Json::parse(c.schema), options);
  ASSERT_TRUE(g.ok()) << c.schema << ": " << g.status();
  for (const std::string& t : c.accepted) EXPECT_TRUE(Accepts(*g, t)) << c.schema << " " << t;
  for (const std::string& t : c.refused) EXPECT_FALSE(Accepts(*g, t)) << c.schema << " " << t;
}

TEST(JsonSchemaTest, Primitives) {
  Check({R"({"type": "integer"})",
         {"0", "-7", "123456789012345"},
         {"01", "1.5", "-", "\"1\"", "1e3"}});
  // Two exponent digits: every number is a finite double (3E333 is out of range for Go's,
  // Rust's and nlohmann's JSON parsers).
  Check({R"({"type": "number"})",
         {"0", "-0.25", "1e+10", "2E-3", "7", "9.5e99", "1E-99"},
         {".5", "1.", "1e", "+1", "1e100", "3E333"}});
  Check({R"({"type": "boolean"})", {"true", "false"}, {"True", "1", "tru"}});
  Check({R"({"type": "null"})", {"null"}, {"nul", "None"}});
  Check({R"({"type": ["string", "null"]})", {"null", "\"x\""}, {"1"}});
}

TEST(JsonSchemaTest, StringsEscapesUtf8AndLengths) {
  Check({R"({"type": "string"})",
         {"\"\"", "\"a b\"", "\"\\\"\\\\\\n\\u00e9\"", "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\""},
         {"\"a", "\"\n\"", "\"\\x\"", "\"\\ud800\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "'a'"}});
  // Lengths count characters, not bytes.
  Check({R"({"type": "string", "minLength": 2, "maxLength": 3})",
         {"\"ab\"", "\"abc\"", "\"\xC3\xA9\xC3\xA9\"", "\"\\n\\t\""},
         {"\"a\"", "\"abcd\"", "\"\xC3\xA9\""}});
}

TEST(JsonSchemaTest, Formats) {
  Check({R"({"type": "string", "format": "date"})",
         {"\"2024-02-28\"", "\"1999-12-31\""},
         {"\"2024-02-30\"", "\"2024-13-01\"", "\"2024-04-31\"", "\"24-01-01\"", "\"0000-01-01\""}});
  Check({R"({"format": "date-time"})",
         {"\"2024-01-31T23:59:59Z\"", "\"2024-06-30T00:00:00+05:30\""},
         {"\"2024-01-31T24:00:00Z\"", "\"2024-01-31T23:59:59\"", "\"2024-01-31 23:59:59Z\""}});
  Check({R"({"type": "string", "format": "uuid"})",
         {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\"", "\"123E4567-E89B-12D3-A456-426614174000\""}});
  Check({R"({"type": "string", "format": "email"})",
         {"\"ada@example.com\"", "\"first.last+tag@mail.example.co.uk\""},
         {"\"ada\"", "\"ada@localhost\"", "\"@example.com\"", "\"a b@example.com\"",
          "\"Ada@Example.com\""}});
  // OpenAI's other strict-mode formats, as subsets ajv-formats (full mode) accepts.
  Check({R"({"type": "string", "format": "ipv4"})",
         {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\""},
         {"\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\"", "\"1.2.3.4.5\""}});
  Check({R"({"type": "string", "format": "ipv6"})",
         {"\"2001:db8:0:0:0:0:2:1\"", "\"::1\"", "\"::\"", "\"fe80::1:2\"", "\"a:b:c::d:e:f:1\""},
         {"\"1::2::3\"", "\"2001:DB8::1\"", "\"1:2:3:4:5:6:7:8:9\"", "\"a:b:c:d::e:f:1:2\"",
          "\"12345::1\""}});
  Check({R"({"type": "string", "format": "hostname"})",
         {"\"localhost\"", "\"api.example.com\"", "\"a-b.c\""},
         {"\"-a.com\"", "\"a..b\"", "\"a_b\"", "\"a.\""}});
  Check({R"({"type": "string", "format": "duration"})",
         {"\"P3D\"", "\"PT1H30M\"", "\"P1Y2M3DT4H5M6S\"", "\"P2W\""},
         {"\"P\"", "\"PT\"", "\"P1YT\"", "\"1D\"", "\"P1H\"", "\"P1D2W\""}});
  // OpenAPI's numeric formats, as ajv-formats checks them.
  Check({R"({"type": "integer", "format": "int32"})",
         {"2147483647", "-2147483648", "0"},
         {"2147483648", "-2147483649", "1.5"}});
  Check({R"({"type": "number", "format": "int64"})", {"7", "-99999999999"}, {"7.5"}});
  Check({R"({"type": "number", "format": "double", "maximum": 2})", {"1.5", "-3"}, {"2.5"}});
  Check(
      {R"({"type": ["string", "integer"], "format": "date"})", {"5", "\"2024-01-01\""}, {"\"x\""}});
  Check({R"({"type": "string", "format": "uri"})",
         {"\"https://example.com\"", "\"http://api.example.org/v1/items/42\""},
         {"\"example.com\"", "\"ftp://example.com\"", "\"https://exa mple.com\"",
          "\"https://example.com/a b\""}});
}

TEST(JsonSchemaTest, ObjectsWriteDeclaredPropertiesInOrderRequiredOnesAlways) {
  const Case c{R"({"type": "object",
                   "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                  "c": {"type": "boolean"}},
                   "required": ["b"]})",
               {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"a": 1, "b": "x", "c": true})",
                "{\n  \"b\": \"x\",\n  \"c\": false\n}"},
               {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","d":1})", R"({"b":"x",})",
                R"({,"b":"x"})", R"({"b":"x""c":true})", R"({"b":1})"}};
  Check(c);
  Check({R"({"type": "object", "required": ["id"]})", {R"({"id": [1, {"x": null}]})"}, {R"({})"}});
}

TEST(JsonSchemaTest, ObjectsWithoutPropertiesFollowAdditionalProperties) {
  Check({R"({"type": "object", "additionalProperties": {"type": "integer"}})",
         {R"({})", R"({"x": 1, "y": 2})"},
         {R"({"x": "1"})"}});
  Check({R"({"type": "object", "additionalProperties": false})", {R"({})", "{ }"}, {R"({"x":1})"}});
  // Under strict, additionalProperties defaults to false; otherwise any member is allowed.
  Check({R"({"type": "object"})", {R"({})"}, {R"({"x":1})"}}, {.strict = true});
  Check({R"({"type": "object"})", {R"({"x": {"y": [true]}})"}, {}});
}

// A required name without a schema of its own takes additionalProperties' (the review's find: it
// took any value); a name required twice is written once.
TEST(JsonSchemaTest, RequiredNamesWithoutAPropertyFollowAdditionalProperties) {
  Check({R"({"required": ["b", "b"], "additionalProperties": {"type": "integer"}})",
         {R"({"b": 1})"},
         {R"({"b": "1"})", R"({"b": 1, "b": 1})", R"({})"}});
  for (const char* schema :
       {R"({"properties": {"a": {}}, "required": ["a", "b"], "additionalProperties": false})"}) {
    EXPECT_THAT(CompileJsonSchema(Json::parse(schema)).status().message(),
                HasSubstr("'b' is required but additionalProperties forbids it"));
  }
}

// A branch that can never end (a required property whose schema is its own) is left out, so the
// output cannot start it and be stuck: only the other branch remains (the review's find).
TEST(JsonSchemaTest, BranchesThatCanNeverEndAreLeftOut) {
  auto g = CompileJsonSchema(Json::parse(R"({"anyOf": [{"type": "null"}, {"$ref": "#/$defs/x"}],
      "$defs": {"x": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
                      "required": ["a"]}}})"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Accepts(*g, "null"));
  GrammarMatcher m(*g);
  EXPECT_FALSE(m.Advance("{"));  // not even a prefix: nothing after it could ever end
}

TEST(JsonSchemaTest, TooManyOptionalPropertiesAreRefused) {
  Json schema = Json::object({{"type", "object"}, {"properties", Json::object()}});
  for (int i = 0; i < 300; ++i) schema["properties"]["p" + std::to_string(i)] = Json::object();
  EXPECT_THAT(CompileJsonSchema(schema).status().message(),
              HasSubstr("300 optional properties; at most 256"));
}

TEST(JsonSchemaTest, ArraysBoundTheirItems) {
  Check({R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
         {"[1]", "[1, 2,3]", "[ 1 ]"},
         {"[]", "[1,2,3,4]", "[1,]", "[\"1\"]"}});
  Check({R"({"type": "array", "maxItems": 0})", {"[]"}, {"[1]"}});
  Check({R"({"type": "array"})", {"[]", "[1, \"a\", null, {}]"}, {"[,]"}});
}

TEST(JsonSchemaTest, EnumConstAnyOfOneOfAndRefs) {
  Check({R"({"enum": ["red", "green", "greenish", 3, null]})",
         {"\"red\"", "\"green\"", "\"greenish\"", "3", "null"},
         {"\"gree\"", "\"blue\"", "4"}});
  Check({R"({"type": "string", "enum": ["a", 1]})", {"\"a\""}, {"1"}});
  Check({R"({"const": {"k": [1, 2]}})", {R"({"k":[1,2]})"}, {R"({"k": [1, 2]})"}});
  Check({R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})",
         {"1", "\"a\""},
         {"\"ab\"", "true"}});
  Check({R"({"oneOf": [{"type": "integer"}, {"type": "string"}]})", {"1", "\"a\""}, {"null"}});
  Check({R"({"$defs": {"node": {"type": "object",
                                "properties": {"v": {"type": "integer"},
                                               "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                  {"type": "null"}]}},
                                "required": ["v", "next"]}},
            "$ref": "#/$defs/node"})",
         {R"({"v":1,"next":{"v":2,"next":null}})"},
         {R"({"v":1,"next":{"v":2}})"}});
}

TEST(JsonSchemaTest, WhitespaceBetweenTokensIsOneLineBreakAndBoundedIndentation) {
  const std::string eight(8, ' ');
  Check({R"({"type": "array"})",
         {"[" + eight + "]", "[\n" + eight + "1,\r\n\t2\n]", "[ ]"},
         {"[" + eight + " ]", "[\n\n]", " []", "[] ", "[\n" + eight + " 1]"}});
}

TEST(JsonSchemaTest, WhatIsNotSupportedIsRefusedByName) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {R"({"type": "string", "pattern": "(a)\\1"})", "pattern: regex at offset 3: backreferences"},
      {R"({"type": "string", "pattern": 7})", "pattern must be a string"},
      {R"({"type": "integer", "multipleOf": 0.5})", "'multipleOf' 0.5 is not supported"},
      {R"({"type": "number", "multipleOf": 1001})", "only an integer from 1 to 1000"},
      {R"({"type": "integer", "multipleOf": 0})", "'multipleOf' must be a number above 0"},
      {R"({"type": "integer", "multipleOf": "2"})", "'multipleOf' must be a number above 0"},
      {R"({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9})",
       "no multiple of 10 lies within its bounds"},
      {R"({"type": "integer", "not": {"const": 1}})", "keyword 'not' is supported with a type"},
      {R"({"type": "number", "minimum": 2, "exclusiveMaximum": 2})", "no number of at most 15"},
      {R"({"type": "number", "maximum": "3"})", "'maximum' must be a number"},
      {R"({"type": "integer", "minimum": "1"})", "'minimum' must be a number"},
      {R"({"properties": {"x": {"nullable": true}}})", "'/properties/x': keyword 'nullable'"},
      {R"({"type": "string", "format": "ipv5"})", "format 'ipv5' is not supported"},
      {R"({"type": "integer", "format": "uint8"})", "format 'uint8' is not supported on numbers"},
      {R"({"type": "number", "format": 32})", "format must be a string"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "a type of its own"},
      {R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})",
       "keyword 'allOf' is supported with one"},
      {R"({"type": "object", "allOf": [{"type": "integer"}]})", "its type is \"integer\""},
      {R"({"$ref": "http://example.com/s.json"})", "does not point into this schema"},
      {R"({"$ref": "#/$defs/missing"})", "points at nothing"},
      // fuzz_json_schema's first find: nlohmann throws on these pointers (it ended the process).
      {R"({"$defs": {"n": {}}, "$ref": "#/$defs/~"})", "is not a JSON pointer"},
      {R"({"$defs": [{}], "$ref": "#/$defs/01"})", "$ref '#/$defs/01'"},
      {R"({"$defs": [{}], "$ref": "#/$defs/-"})", "$ref '#/$defs/-'"},
      {R"({"type": "tuple"})", "unknown type 'tuple'"},
  };
  ExpectRefused(cases);
}

// pydantic's discriminated unions: oneOf of objects told apart by a required property of const
// or enum values (the OpenAPI `discriminator` beside it is an annotation). What is valid for one
// branch fails the others, so oneOf is written as anyOf.
TEST(JsonSchemaTest, OneOfObjectsToldApartByAConstPropertyCompile) {
  Check({R"({"$defs": {
               "Cat": {"type": "object", "required": ["pet_type", "meows"],
                       "properties": {"pet_type": {"const": "cat", "type": "string"},
                                      "meows": {"type": "integer"}}},
               "Dog": {"type": "object", "required": ["pet_type", "barks"],
                       "properties": {"pet_type": {"enum": ["dog", "puppy"]},
                                      "barks": {"type": "number"}}}},
             "type": "object", "required": ["pet"],
             "properties": {"pet": {
               "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
               "discriminator": {"propertyName": "pet_type",
                                 "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}}})",
         {R"({"pet":{"pet_type":"cat","meows":3}})", R"({"pet":{"pet_type":"puppy","barks":1.5}})"},
         {R"({"pet":{"pet_type":"dog","meows":3}})", R"({"pet":{"pet_type":"cat","barks":1}})",
          R"({"pet":{"meows":3}})"}});
  const auto refused = [](const char* schema) { ExpectRefused(schema, "tells it apart"); };
  // A value both branches take; an optional property ({} is valid for both); 1 and 1.0 (one
  // value to JSON Schema); branches that are not only objects.
  refused(R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                        {"type": "object", "properties": {"k": {"enum": ["b", "a"]}},
                         "required": ["k"]}]})");
  refused(R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}},
                        {"type": "object", "properties": {"k": {"const": "b"}}}]})");
  refused(R"({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                        {"type": "object", "properties": {"k": {"const": 1.0}},
                         "required": ["k"]}]})");
  // A branch that may be null: null is valid for both.
  refused(R"({"oneOf": [{"type": ["object", "null"], "properties": {"k": {"const": 1}},
                         "required": ["k"]},
                        {"type": ["object", "null"], "properties": {"k": {"const": 2}},
                         "required": ["k"]}]})");
}

// multipleOf (an integer divisor): the multiples within the bounds, as integers for a number too
// (a validator accepts 4.0 as well; the grammar writes a subset). engine/grammar/
// integer_multiples_test checks the arithmetic exhaustively.
TEST(JsonSchemaTest, MultipleOfWritesTheMultiplesWithinTheBounds) {
  Check({R"({"type": "integer", "multipleOf": 5, "minimum": 3, "maximum": 40})",
         {"5", "10", "40"},
         {"0", "3", "7", "45", "-5", "05"}});
  Check({R"({"type": "number", "multipleOf": 2.0, "minimum": 0.5, "exclusiveMaximum": 8})",
         {"2", "4", "6"},
         {"0", "8", "3", "4.0", "2e0"}});
  Check({R"({"multipleOf": 3})", {"9", "-3", "0", "123456789012345"}, {"\"x\"", "10", "-0"}});
  Check({R"({"type": ["integer", "null"], "multipleOf": 1000})",
         {"null", "-2000", "999999999999000"},
         {"1", "500"}});
  // Only numbers are multiples: beside another type it constrains nothing.
  Check({R"({"type": "string", "multipleOf": 2, "maxLength": 2})", {"\"ab\""}, {"2"}});
}

// Integer bounds: every integer of a window around each bound is accepted exactly when it lies
// within them (inclusive, exclusive, fractional, negative, across digit counts).
TEST(JsonSchemaTest, IntegerBoundsAcceptExactlyTheIntegersWithinThem) {
  struct Case {
    const char* schema;
    int64_t lo, hi;
  };
  const Case cases[] = {
      {R"({"type": "integer", "minimum": 0, "maximum": 100})", 0, 100},
      {R"({"type": "integer", "minimum": 123, "maximum": 456})", 123, 456},
      {R"({"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 5})", -9, 4},
      {R"({"type": "integer", "minimum": -1000.5, "maximum": -7.5})", -1000, -8},
      {R"({"type": "integer", "minimum": 95, "maximum": 1005})", 95, 1005},
      {R"({"type": "integer", "minimum": 7, "maximum": 7})", 7, 7},
  };
  for (const Case& c : cases) {
    auto g = CompileJsonSchema(Json::parse(c.schema));
    ASSERT_TRUE(g.ok()) << c.schema << ": " << g.status();
    for (int64_t x = c.lo - 1200; x <= c.hi + 1200; ++x) {
      ASSERT_EQ(Accepts(*g, std::to_string(x)), x >= c.lo && x <= c.hi) << c.schema << ": " << x;
    }
    EXPECT_FALSE(Accepts(*g, "007")) << c.schema;
    EXPECT_FALSE(Accepts(*g, "1.0")) << c.schema;
  }
  // JavaScript's safe-integer bounds (zod's int()) are wider than the grammar's 15 digits.
  auto safe = CompileJsonSchema(Json::parse(
      R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})"));
  ASSERT_TRUE(safe.ok()) << safe.status();
  EXPECT_TRUE(Accepts(*safe, "-999999999999999"));
  auto none = CompileJsonSchema(Json::parse(R"({"type": "integer", "minimum": 3, "maximum": 2})"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JsonSchemaTest, FalseSubschemasForbidWhatTheyGuard) {
  // A property whose schema is false never appears; the others are written as usual.
  Check({R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": false},
             "required": ["a"], "additionalProperties": false})",
         {R"({"a": 1})"},
         {R"({"a": 1, "b": 2})", R"({"b": 2, "a": 1})", R"({})"}});
  // A false branch of anyOf / oneOf matches nothing: the others remain.
  Check({R"({"anyOf": [false, {"type": "integer"}]})", {"3"}, {"\"x\"", "null"}});
  Check({R"({"oneOf": [{"type": "string"}, false]})", {"\"x\""}, {"3"}});
  // items: false allows only the empty array.
  Check({R"({"type": "array", "items": false})", {"[]", "[ ]"}, {"[1]", "[null]"}});
}

TEST(JsonSchemaTest, TuplesFollowTheirPositionsThenAdditionalItems) {
  // Any prefix of the tuple, then any values (additionalItems absent).
  Check({R"({"items": [{"type": "integer"}, {"type": "string"}]})",
         {"[]", "[1]", R"([1, "a"])", R"([1, "a", null, 2])"},
         {R"(["a"])", R"([1, 2])", "{}"}});
  // Closed, with a minimum: exactly one or two items of the tuple.
  Check({R"({"type": "array", "items": [{"type": "integer"}, {"type": "boolean"}],
             "additionalItems": false, "minItems": 1})",
         {"[1]", "[1, true]"},
         {"[]", "[1, true, 2]", "[true]"}});
  // Later positions follow additionalItems' schema, up to maxItems.
  Check({R"({"items": [{"type": "string"}], "additionalItems": {"type": "integer"},
             "maxItems": 3})",
         {R"(["a"])", R"(["a", 1, 2])"},
         {R"(["a", "b"])", R"(["a", 1, 2, 3])"}});
  // A false position ends the array before it.
  Check({R"({"items": [{"type": "integer"}, false]})", {"[]", "[1]"}, {"[1, 2]"}});
}

// Maps (objects without declared properties): propertyNames constrains the keys (pydantic's
// dict[Literal["a", "b"], int]), minProperties and maxProperties their count. On an object with
// declared properties a count is no constraint (outside the written range) or a 400.
TEST(JsonSchemaTest, MapsTakePropertyNamesAndPropertyCounts) {
  Check({R"({"type": "object", "additionalProperties": {"type": "integer"},
             "propertyNames": {"enum": ["a", "b"]}, "minProperties": 1, "maxProperties": 2})",
         {R"({"a": 1})", R"({"b": 2, "a": 3})"},
         {"{}", R"({"c": 1})", R"({"a": 1, "b": 2, "a": 3})", R"({"a": "x"})"}});
  Check({R"({"propertyNames": {"pattern": "^x[0-9]$"}})",
         {"{}", R"({"x1": null, "x2": [true]})"},
         {R"({"y1": 1})", R"({"x12": 1})"}});
  Check({R"({"propertyNames": false})", {"{}"}, {R"({"a": 1})"}});
  Check({R"({"maxProperties": 0})", {"{}"}, {R"({"a": 1})"}});
  // Declared properties: the counts hold whatever is written (1 to 2 properties here).
  Check({R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a"], "minProperties": 1, "maxProperties": 2})",
         {R"({"a": 1})", R"({"a": 1, "b": 2})"},
         {"{}"}});
  ExpectRefused(
      {{R"({"properties": {"a": {}, "b": {}}, "minProperties": 1})",
        "between the required and the declared"},
       {R"({"properties": {"a": {}}, "required": ["a"], "maxProperties": 0})", "leaves no room"},
       {R"({"properties": {"a": {}}, "propertyNames": {"maxLength": 3}})",
        "propertyNames beside properties"},
       {R"({"propertyNames": {"type": "integer"}})", "must describe strings"},
       {R"({"propertyNames": {"anyOf": [{"const": "a"}]}})", "'anyOf' is not supported"},
       {R"({"minProperties": 3, "maxProperties": 2})", "minProperties > maxProperties"},
       {R"({"additionalProperties": false, "minProperties": 1})", "no property is allowed"}});
}

// dependentRequired (draft 7: dependencies with lists): a dependent of a writable trigger is
// written always; a trigger whose dependent cannot be written is left out.
TEST(JsonSchemaTest, DependentsOfAWritableTriggerAreWrittenAlways) {
  Check({R"({"properties": {"card": {"type": "string", "maxLength": 4},
                            "billing": {"type": "string", "maxLength": 4},
                            "note": {"type": "null"}},
             "dependentRequired": {"card": ["billing"]}})",
         {R"({"billing": "x"})", R"({"card": "1", "billing": "x"})",
          R"({"billing": "x", "note": null})"},
         {R"({"card": "1"})", "{}", R"({"note": null})"}});
  // Chains follow (a needs b, b needs c); a trigger needing a false property is never written.
  Check({R"({"properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"},
                            "d": false, "e": {"type": "null"}},
             "dependencies": {"a": ["b"], "b": ["c"], "e": ["d"]}})",
         {R"({"b": null, "c": null})", R"({"a": null, "b": null, "c": null})"},
         {R"({"a": null, "b": null})", R"({"c": null, "e": null})"}});
  ExpectRefused(
      {{R"({"properties": {"a": {}}, "dependencies": {"a": {"required": ["b"]}}})",
        "dependentSchemas"},
       {R"({"dependentRequired": {"a": ["b"]}})", "without declared properties"},
       {R"({"properties": {"a": {}, "b": false}, "required": ["a"],
                "dependentRequired": {"a": ["b"]}})",
        "'a' is required and needs 'b'"},
       {R"({"properties": {"a": {}}, "dependentRequired": {"a": [1]}})", "must list strings"}});
}

// The review's finds (a helper reading the change): each was accepted or unbounded before.
TEST(JsonSchemaTest, EqualValuesRefsWithSiblingsAndDraftsAreHonoured) {
  // oneOf: a branch that does not require the property, array values, 0 and -0.0: a value valid
  // for two branches.
  ExpectRefused(
      R"({"oneOf": [{"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]},
                        {"type": "object", "properties": {"k": {"const": 2}}}]})",
      "tells it apart");
  ExpectRefused(R"({"oneOf": [{"properties": {"k": {"const": [1]}}, "required": ["k"]},
                        {"properties": {"k": {"const": [1.0]}}, "required": ["k"]}]})",
                "tells it apart");
  ExpectRefused(R"({"oneOf": [{"properties": {"k": {"const": 0}}, "required": ["k"]},
                        {"properties": {"k": {"const": -0.0}}, "required": ["k"]}]})",
                "tells it apart");
  // uniqueItems: 0 and -0.0 are one value; a $ref with a keyword beside it is not followed.
  Check({R"({"items": {"enum": [0, -0.0]}, "uniqueItems": true})", {"[0]", "[]"}, {"[0, -0.0]"}});
  ExpectRefused(R"({"$defs": {"C": {"enum": ["red", "green"]}},
              "items": {"$ref": "#/$defs/C", "const": "red"}, "uniqueItems": true})",
                "items are enum or const");
  ExpectRefused(
      R"({"prefixItems": [{"const": "x"}], "items": {"enum": ["a", "b"]}, "uniqueItems": true})",
      "items are enum or const");
  Check({R"({"items": false, "uniqueItems": true})", {"[]"}, {"[1]"}});
  ExpectRefused(R"({"$defs": {"K": {"type": "string"}}, "propertyNames": {"$ref": "#/$defs/K",
                                                                     "maxLength": 1}})",
                "propertyNames must be a schema object");
  // A repeated key counts once for a validator.
  ExpectRefused(R"({"additionalProperties": {"type": "integer"}, "minProperties": 2})",
                "minProperties above 1");
  ExpectRefused(R"({"properties": {"a": {}}, "minProperties": 2})",
                "minProperties above the declared");
  // prefixItems under a draft-7 $schema is no keyword there: items applies to every item.
  ExpectRefused(R"({"$schema": "http://json-schema.org/draft-07/schema#",
              "prefixItems": [{"type": "string"}], "items": {"type": "integer"}})",
                "draft 2020-12 keyword");
  // A schema of many small subschemas that each add many rules stops at the budget.
  Json big = Json::parse(R"({"items": false, "prefixItems": []})");
  for (int i = 0; i < 100; ++i)
    big["prefixItems"].push_back({{"type", "integer"}, {"multipleOf", 997}});
  EXPECT_THAT(CompileJsonSchema(big).status().message(), HasSubstr("symbols"));
  // ... before it writes much more than the budget (without the check it wrote ~30x as much,
  // taking 1.3 GB, and refused only at the end).
  GrammarBuilder b(1 << 20);
  JsonRules json(b, 8);
  EXPECT_FALSE(AddJsonSchema(big, {}, b, json).ok());
  EXPECT_LT(b.symbols(), 2 << 20);
}

// uniqueItems over enum values (pydantic's set[Literal["a", "b"]]): each value at most once, in
// the enum's order; 1 and 1.0 are one value. Other items are a 400 naming it; so is a minimum
// past the distinct values.
TEST(JsonSchemaTest, UniqueItemsOverEnumValuesWritesEachAtMostOnce) {
  Check({R"({"type": "array", "uniqueItems": true,
             "items": {"enum": ["red", "green", "blue"], "type": "string"}})",
         {"[]", R"(["green"])", R"(["red", "blue"])", R"(["red", "green", "blue"])"},
         {R"(["red", "red"])", R"(["blue", "red"])", R"(["red", "green", "blue", "red"])"}});
  Check({R"({"$defs": {"Size": {"enum": [1, 1.0, 2, null]}},
             "items": {"$ref": "#/$defs/Size"}, "uniqueItems": true, "minItems": 2})",
         {"[1, 2]", "[2, null]", "[1, 2, null]"},
         {"[1]", "[1, 1.0]", "[1, 1]", "[]"}});
  Check(
      {R"({"items": {"const": "x"}, "uniqueItems": true})", {"[]", R"(["x"])"}, {R"(["x", "x"])"}});
  // uniqueItems false, or at most one item: no constraint.
  Check({R"({"items": {"type": "integer"}, "uniqueItems": false})", {"[1, 1]"}, {R"(["a"])"}});
  Check({R"({"items": {"type": "integer"}, "uniqueItems": true, "maxItems": 1})",
         {"[3]"},
         {"[3, 4]"}});
  ExpectRefused(
      {{R"({"items": {"type": "string"}, "uniqueItems": true})", "items are enum or const"},
       {R"({"uniqueItems": true})", "items are enum or const"},
       {R"({"prefixItems": [{"enum": [1]}], "uniqueItems": true})", "items are enum or const"},
       {R"({"items": {"enum": [[1], [2]]}, "uniqueItems": true})", "object or array values"},
       {R"({"items": {"enum": ["a", "b"]}, "uniqueItems": true, "minItems": 3})",
        "2 distinct values"},
       {R"({"items": {"enum": ["a"]}, "uniqueItems": "yes"})", "must be a boolean"}});
}

// Draft 2020-12's tuples, as pydantic v2 writes tuple[int, str] (prefixItems with both counts)
// and tuple[int, *tuple[str, ...]] (items after the prefix).
TEST(JsonSchemaTest, PrefixItemsAreTuplesWithItemsForTheRest) {
  Check({R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
             "minItems": 2, "maxItems": 2})",
         {R"([1, "a"])"},
         {"[1]", R"([1, "a", 2])", R"(["a", 1])"}});
  Check({R"({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "minItems": 1})",
         {"[1]", R"([1, "a", "b"])"},
         {"[]", R"([1, 2])", R"(["a"])"}});
  Check({R"({"prefixItems": [{"type": "boolean"}], "items": false})",
         {"[]", "[true]"},
         {"[true, false]"}});
  for (const char* schema : {R"({"prefixItems": [{}], "additionalItems": false})",
                             R"({"prefixItems": [{}], "items": [{}]})", R"({"prefixItems": {}})"}) {
    auto g = CompileJsonSchema(Json::parse(schema));
    EXPECT_THAT(g.status().message(), HasSubstr("prefixItems")) << schema;
  }
}

TEST(JsonSchemaTest, AllOfOneSchemaIsThatSchema) {
  // pydantic v1's way of describing a $ref field.
  Check({R"({"$defs": {"Color": {"enum": ["red", "green"]}},
             "properties": {"c": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "a color"}},
             "required": ["c"]})",
         {R"({"c": "red"})"},
         {R"({"c": "blue"})", R"({})"}});
}

// not of a type writes the other types; not of {} or true (zod's never) is false.
TEST(JsonSchemaTest, NotOfATypeWritesTheOthers) {
  Check({R"({"not": {"type": "null"}})", {"1", R"("a")", "true", "[]"}, {"null"}});
  Check({R"({"type": ["string", "null"], "not": {"type": "null", "description": "no null"}})",
         {R"("a")"},
         {"null", "1"}});
  // An excluded integer takes every number with it: 1.5 is valid but not written.
  Check({R"({"not": {"type": "integer"}})", {R"("a")", "null"}, {"1", "1.5"}});
  Check({R"({"not": false, "type": "boolean"})", {"true"}, {"1"}});
  Check({R"({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "integer"}},
             "additionalProperties": false})",
         {R"({"b": 1})", R"({})"},
         {R"({"a": 1})", R"({"a": null, "b": 1})"}});
  const std::vector<std::pair<const char*, const char*>> refused{
      {R"({"not": {"minimum": 3}})", "keyword 'not' is supported with a type"},
      {R"({"not": {}})", "no value satisfies it"},
      {R"({"type": "integer", "not": {"type": "number"}})", "leaves no type"},
      {R"({"not": {"type": "tuple"}})", "unknown type 'tuple'"},
  };
  ExpectRefused(refused);
}

// patternProperties of one pattern without declared properties: a map of keys matching it.
TEST(JsonSchemaTest, PatternPropertiesOfOnePatternAreAMap) {
  Check({R"({"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
             "additionalProperties": false})",
         {R"({})", R"({"x-a": 1})", R"({"x-a": 1, "x-b": 2})"},
         {R"({"a": 1})", R"({"x-a": "1"})"}});
  Check({R"({"patternProperties": {"[0-9]": {"type": "boolean"}}, "maxProperties": 1})",
         {R"({"a1": true})"},
         {R"({"a1": true, "b2": false})", R"({"ab": true})"}});
  const std::vector<std::pair<const char*, const char*>> refused{
      {R"({"properties": {"a": {}}, "patternProperties": {"a": {"type": "string"}}})",
       "patternProperties beside properties"},
      {R"({"patternProperties": {"^a": {}, "b$": {"type": "string"}}})", "more than one pattern"},
      {R"({"patternProperties": {"(a)\\1": {}}})", "backreferences"},
  };
  ExpectRefused(refused);
}

// Keywords beside anyOf or oneOf apply to every branch (OpenAPI's "at least one of these
// fields", a base type narrowed by alternatives): each branch is compiled with them.
TEST(JsonSchemaTest, KeywordsBesideAChoiceApplyToEveryBranch) {
  Check({R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
             "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})",
         {R"({"a": 1})", R"({"b": "x"})", R"({"a": 1, "b": "x"})"},
         {R"({})", R"({"a": "1"})", R"({"c": 1})"}});
  Check({R"({"type": ["string", "integer"],
             "oneOf": [{"type": "string", "maxLength": 2}, {"type": "number", "minimum": 5}]})",
         {R"("ab")", "7"},
         {R"("abc")", "4", "7.5", "null"}});
  // A branch whose types none of the choice's are is left out; an enum keeps its typed values.
  Check({R"({"type": "string", "anyOf": [{"type": "integer"}, {"enum": ["x", 1]}]})",
         {R"("x")"},
         {"1", R"("y")"}});
  const std::vector<std::pair<const char*, const char*>> refused{
      {R"({"maxLength": 5, "anyOf": [{"maxLength": 2}, {"type": "string"}]})",
       "keyword 'maxLength' beside the choice and in this branch with another value"},
      {R"({"additionalProperties": false, "anyOf": [{"properties": {"a": {}}}]})",
       "would change each other's meaning"},
      {R"({"type": "tuple", "anyOf": [{"type": "string"}]})", "unknown type 'tuple'"},
  };
  ExpectRefused(refused);
}

// A model extending another (pydantic's inheritance, zod's .and(), an interface's extends): the
// object of every property and every required name, in the order they appear.
TEST(JsonSchemaTest, AllOfObjectSchemasAreMerged) {
  Check({R"({"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}},
                                "required": ["id"]}},
             "allOf": [{"$ref": "#/$defs/Base"},
                       {"properties": {"tags": {"type": "array", "items": {"type": "string"}}}}],
             "properties": {"name": {"type": "string"}}, "required": ["name"]})",
         {R"({"id": 1, "name": "x"})", R"({"id": 1, "tags": ["a"], "name": "x"})"},
         {R"({"name": "x"})", R"({"id": 1})", R"({"id": "1", "name": "x"})",
          R"({"id": 1, "tags": [2], "name": "x"})", R"({"id": 1, "name": "x", "other": 2})"}});
  // Nested allOfs and an equal property in two schemas merge too.
  Check({R"({"allOf": [{"allOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]}]},
                       {"properties": {"a": {"const": 1}, "b": {"type": "boolean"}},
                        "required": ["b"]}]})",
         {R"({"a": 1, "b": true})"},
         {R"({"b": true})", R"({"a": 2, "b": true})"}});
  const std::vector<std::pair<const char*, const char*>> refused{
      {R"({"allOf": [{"properties": {"a": {"type": "integer"}}},
                     {"properties": {"a": {"type": "string"}}}]})",
       "property 'a' has two different schemas"},
      {R"({"allOf": [{"type": "object"}, {"additionalProperties": false}]})",
       "it has keyword 'additionalProperties'"},
      {R"({"allOf": [{"type": "object"}, {"type": "string"}]})", "its type is \"string\""},
      {R"({"$defs": {"L": {"allOf": [{"$ref": "#/$defs/L"}, {}]}}, "$ref": "#/$defs/L"})",
       "nested deeper than"},
  };
  ExpectRefused(refused);
}

TEST(JsonSchemaTest, SchemasNoValueSatisfiesAreErrors) {
  for (const char* schema :
       {R"(false)", R"({"enum": []})", R"({"type": "string", "enum": [1]})",
        R"({"type": "array", "minItems": 3, "maxItems": 2})", R"({"type": []})",
        R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
        R"({"anyOf": [false, false]})", R"({"type": "array", "items": false, "minItems": 1})",
        R"({"properties": {"a": false}, "required": ["a"]})",
        R"({"items": [{}], "additionalItems": false, "minItems": 2})"}) {
    auto g = CompileJsonSchema(Json::parse(schema));
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << schema;
  }
}

TEST(JsonSchemaTest, HugeSchemasAreRefusedNotCompiledForever) {
  auto g = CompileJsonSchema(Json::parse(R"({"type": "string", "maxLength": 100000000})"));
  EXPECT_THAT(g.status().message(), HasSubstr("symbols"));
  Json many = Json::object({{"enum", Json::array()}});
  for (int i = 0; i < 10000; ++i) many["enum"].push_back("value-" + std::to_string(i));
  auto e = CompileJsonSchema(many);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(Accepts(*e, "\"value-9999\""));
  EXPECT_FALSE(Accepts(*e, "\"value-10000\""));
}

}  // namespace
}  // namespace specula::grammar
