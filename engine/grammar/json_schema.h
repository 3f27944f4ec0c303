// JSON Schema (the subset real tool and response schemas use) to a Grammar whose sentences are
// JSON texts valid against the schema: constrained decoding can then only produce valid output.
//
// Supported: type (one or a list), enum, const, object (properties in the schema's order,
// required, additionalProperties), array (items, minItems, maxItems), string (minLength,
// maxLength, pattern (engine/grammar/regex.h), format date / time / date-time / uuid), integer
// and number (with bounds: engine/grammar/number_range.h; multipleOf an integer up to 1,000:
// engine/grammar/integer_multiples.h), boolean, null, anyOf,
// oneOf whose branches have distinct types, $ref into the document ("#", "#/$defs/..."), and the
// annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly). Any other keyword is INVALID_ARGUMENT naming it and where it is, never
// ignored; so is a schema no JSON value satisfies.
//
// The grammar produces a subset of the valid texts, chosen so that an answer always can end:
// - an object writes its declared properties in the schema's order (each optional one may be
//   left out) and no others; only an object schema without properties whose
//   additionalProperties allows them (not under `strict`) takes arbitrary keys;
// - whitespace between tokens is at most one line break and `max_whitespace` spaces or tabs
//   (enough to indent a few levels, too little for a model to pad forever);
// - numbers have at most 15 integer digits, 15 fraction digits and 2 exponent digits
//   (every number a finite double);
// - strings escape with \uXXXX only outside the surrogate range;
// - a date's day is at most 28 in February (no leap-year arithmetic).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace specula::grammar {

struct JsonSchemaOptions {
  // OpenAI's strict mode: additionalProperties defaults to false.
  bool strict = false;
  int max_whitespace = 8;
  // A schema compiling to more grammar symbols than this is refused (e.g. a huge maxLength).
  int64_t max_symbols = 1 << 20;
};

class JsonRules;

// Adds the rules of `schema`'s texts to `b` (whose JSON building blocks are `json`) and returns
// the rule: for grammars that embed a schema's values (tool calls). `options.max_symbols` is
// `b`'s.
absl::StatusOr<int32_t> AddJsonSchema(const nlohmann::ordered_json& schema,
                                      const JsonSchemaOptions& options, GrammarBuilder& b,
                                      JsonRules& json);

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

// Any JSON object (OpenAI's response_format {"type": "json_object"}), with the same whitespace
// and number bounds.
absl::StatusOr<std::shared_ptr<const Grammar>> AnyJsonObject(const JsonSchemaOptions& options = {});

}  // namespace specula::grammar
