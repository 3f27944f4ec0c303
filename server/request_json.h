// Parsing the JSON of a request (HTTP bodies, tool schemas and arguments, chat_template_kwargs)
// in time linear in its size, whatever its shape. nlohmann::ordered_json's own parser searches an
// object's keys linearly on every insert: 60k keys (0.65 MB) took 4.1 s on the tokenizer thread.
// This one builds the same ordered value through nlohmann's SAX interface, appending each member
// and finding duplicates in a hash set, and refuses what no real request needs, naming the limit.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace specula {

using OrderedJson = nlohmann::ordered_json;

// The deepest nesting of arrays and objects a request's JSON may have. Copying a value and
// rendering a template recurse once per level, so a body of a few MB nested a million deep would
// overflow the stack; real requests nest a handful.
inline constexpr int kMaxJsonDepth = 64;
// Members of one object: every later lookup in an ordered object is a linear search, so this
// keeps them cheap. A tool schema with this many properties is far beyond any real one.
inline constexpr size_t kMaxJsonObjectKeys = 4096;
// Elements of one array: a prompt given as token ids holds one per token of the context.
inline constexpr size_t kMaxJsonArrayElements = size_t{1} << 20;

// The value of `text`, key order kept. INVALID_ARGUMENT naming `what` when `text` is not JSON,
// nests deeper than kMaxJsonDepth, has an object with more than kMaxJsonObjectKeys members or a
// key twice, or an array of more than kMaxJsonArrayElements. Parsing stops at the first of these.
absl::StatusOr<OrderedJson> ParseRequestJson(absl::string_view text, absl::string_view what);

}  // namespace specula
