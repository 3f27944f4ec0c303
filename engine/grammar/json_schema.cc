#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/grammar/integer_multiples.h"
#include "engine/grammar/json_rules.h"
#include "engine/grammar/number_range.h"
#include "engine/grammar/regex.h"

namespace specula::grammar {
namespace {

using Json = nlohmann::ordered_json;
using B = GrammarBuilder;

constexpr int kMaxDepth = 64;
// The numeric bounds (draft 6 and later: each a number).
constexpr const char* kBounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
constexpr int64_t kMaxOptionalProperties = 256;
// The kinds of JSON value; "integer" names numbers without a fraction, a kind of number.
constexpr std::array<const char*, 6> kKinds = {"null",  "boolean", "object",
                                               "array", "number",  "string"};

// Keywords with no effect on which texts are valid.
bool IsAnnotation(std::string_view key) {
  static const auto* const kAnnotations = new absl::flat_hash_set<std::string_view>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
      "readOnly", "writeOnly", "$defs", "definitions",
      // OpenAPI's (pydantic writes it beside a discriminated oneOf); validators ignore it, and
      // the branches' own const properties discriminate (SchemaCompiler::Discriminated).
      "discriminator"};
  return kAnnotations->contains(key);
}

// Appends to the array `into` each element of `from` it lacks, in order (a union of required
// names).
void AppendMissing(const Json& from, Json& into) {
  for (const Json& e : from) {
    if (!absl::c_linear_search(into, e)) into.push_back(e);
  }
}

bool IsSupported(std::string_view key) {
  static const auto* const kSupported =
      new absl::flat_hash_set<std::string_view>{"type",
                                                "enum",
                                                "const",
                                                "anyOf",
                                                "oneOf",
                                                "allOf",
                                                "$ref",
                                                "properties",
                                                "required",
                                                "additionalProperties",
                                                "items",
                                                "additionalItems",
                                                "prefixItems",
                                                "uniqueItems",
                                                "propertyNames",
                                                "minProperties",
                                                "maxProperties",
                                                "dependentRequired",
                                                "dependencies",
                                                "patternProperties",
                                                "not",
                                                "minItems",
                                                "maxItems",
                                                "minLength",
                                                "maxLength",
                                                "format",
                                                "pattern",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum",
                                                "multipleOf"};
  return kSupported->contains(key);
}

// The formats written as a subset of their valid strings, one every validator accepts (ajv-formats'
// full mode, RFC 5321 / 3986): an address of lowercase atoms at a dotted host, an http(s) URL of
// a host and unreserved path segments. Bounded, so an answer always ends (an address stays under
// RFC 5321's 254 characters).
constexpr char kHostRegex[] =
    "[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?){0,3}\\.[a-z]{2,12}";
// The others OpenAI's strict mode lists: an IPv4 address without leading zeros; an IPv6 address
// of eight groups, or compressed with "::" and at most seven groups around it (three before,
// four after); a hostname of one to five labels; an ISO 8601 duration (at least one date or
// time component, or weeks alone).
constexpr char kOctetRegex[] = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
constexpr char kHextetRegex[] = "[0-9a-f]{1,4}";
constexpr char kLabelRegex[] = "[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?";
constexpr char kAmountRegex[] = "[0-9]{1,4}";
std::string FormatRegexOf(std::string_view format) {
  if (format == "email") {
    return absl::StrCat("[a-z0-9_+-]{1,32}(\\.[a-z0-9_+-]{1,32}){0,2}@", kHostRegex);
  }
  if (format == "ipv4") return absl::StrCat(kOctetRegex, "(\\.", kOctetRegex, "){3}");
  if (format == "ipv6") {
    const std::string h = kHextetRegex;
    return absl::StrCat(h, "(:", h, "){7}|(", h, "(:", h, "){0,2})?::(", h, "(:", h, "){0,3})?");
  }
  if (format == "hostname") return absl::StrCat(kLabelRegex, "(\\.", kLabelRegex, "){0,4}");
  if (format == "duration") {
    const std::string n = kAmountRegex;
    const std::string date =
        absl::StrCat("(", n, "Y(", n, "M)?(", n, "D)?|", n, "M(", n, "D)?|", n, "D)");
    const std::string time =
        absl::StrCat("T(", n, "H(", n, "M)?(", n, "S)?|", n, "M(", n, "S)?|", n, "S)");
    return absl::StrCat("P(", date, "(", time, ")?|", time, "|", n, "W)");
  }
  return absl::StrCat("https?://", kHostRegex, "(/[a-zA-Z0-9._~-]{0,32}){0,8}");
}

bool IsRegexFormat(std::string_view format) {
  return format == "email" || format == "uri" || format == "ipv4" || format == "ipv6" ||
         format == "hostname" || format == "duration";
}

// Whether the document's $schema names draft 4, 6 or 7, where prefixItems is no keyword.
bool DeclaresDraftBefore2019(const Json& root) {
  if (!root.is_object() || !root.contains("$schema") || !root["$schema"].is_string()) return false;
  const std::string id = root["$schema"].get<std::string>();
  for (const char* old : {"draft-04", "draft-06", "draft-07"}) {
    if (id.find(old) != std::string::npos) return true;
  }
  return false;
}

// The schema `false`: no value is valid against it.
// false, or a schema no value satisfies by its form: {"not": {}} or {"not": true} (zod's never).
bool IsFalse(const Json& s) {
  if (s.is_boolean()) return !s.get<bool>();
  if (!s.is_object() || !s.contains("not")) return false;
  const Json& n = s["not"];
  return n.is_boolean() ? n.get<bool>() : n.is_object() && n.empty();
}

absl::Status Unsatisfiable(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON Schema at '", path, "': no value satisfies it (", why, ")"));
}

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("JSON Schema at '", path, "': ", what));
}

// The JSON types a value has ("integer" values are numbers too).
std::vector<std::string> TypesOf(const Json& v) {
  if (v.is_number_integer()) return {"integer", "number"};
  if (v.is_number()) return {"number"};
  if (v.is_string()) return {"string"};
  if (v.is_boolean()) return {"boolean"};
  if (v.is_null()) return {"null"};
  if (v.is_array()) return {"array"};
  return {"object"};
}

// A scalar's identity under JSON Schema's equality: 1 and 1.0 are one value, and so are -0.0 and
// 0 (%g's six digits may merge two numbers too, which can only refuse a schema or leave a value
// out). Callers keep arrays and objects out: key order and 1.0 inside them would need a deep
// comparison.
std::string EqualityKey(const Json& v) {
  if (!v.is_number()) return v.dump();
  const double d = v.get<double>();
  return absl::StrCat("n", d == 0 ? 0.0 : d);
}

bool IsScalar(const Json& v) { return !v.is_object() && !v.is_array(); }

// The non-negative integer `key` of `s`, or `fallback` when absent.
absl::StatusOr<int64_t> Count(const Json& s, const char* key, int64_t fallback,
                              const std::string& path) {
  auto it = s.find(key);
  if (it == s.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return Invalid(path, absl::StrCat("'", key, "' must be a non-negative integer"));
  }
  return it->get<int64_t>();
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options, GrammarBuilder& b,
                 JsonRules& json)
      : root_(root), options_(options), b_(b), json_(json) {}

  // The rule of the schema's texts.
  absl::StatusOr<int32_t> Run() { return Compile(root_, "", 0); }

 private:
  absl::StatusOr<int32_t> Compile(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> CompileOrAny(const Json& s, const char* key, const std::string& path,
                                       int depth);
  absl::StatusOr<int32_t> Reference(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> Enum(const Json& s, const std::string& path);
  // The values of an enum or const schema that have its type (if it names one).
  absl::StatusOr<std::vector<Json>> EnumValues(const Json& s, const std::string& path);
  absl::StatusOr<int32_t> UniqueArray(const Json& s, const std::string& path, int64_t min,
                                      int64_t max);
  absl::StatusOr<int32_t> Choice(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> Not(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> PatternMap(const Json& s, const std::string& path, int depth, int64_t min,
                                     int64_t max, bool has_properties);
  int32_t EmptyObject();  // "{}"
  // The numeric format of `s` ("" without one, or with a string type's format); INVALID_ARGUMENT
  // for a format numbers cannot honour.
  absl::StatusOr<std::string> NumericFormat(const Json& s, const std::string& path);
  // `s` (an anyOf or oneOf under `key` with other keywords beside it) as the same choice with
  // those keywords in each branch; nullopt when only annotations stand beside it.
  absl::StatusOr<std::optional<Json>> Distributed(const Json& s, const char* key,
                                                  const std::string& path);
  // `branch` (followed through its $refs) with `siblings` added: INVALID_ARGUMENT where a keyword
  // of both differs or the two would change each other's meaning; false when no value is
  // valid for both types.
  absl::StatusOr<Json> WithSiblings(const Json& branch, const Json& siblings,
                                    const std::string& path);
  absl::StatusOr<int32_t> AllOf(const Json& s, const std::string& path, int depth);
  // The properties and required names of object schema `s` (its $refs and nested allOfs
  // followed) added to `merged`'s; INVALID_ARGUMENT when `s` holds anything else.
  absl::Status MergeObject(const Json& s, const std::string& path, int depth, Json& merged);
  // What the $ref of `s` points at: INVALID_ARGUMENT unless only annotations stand beside it
  // and it is a JSON pointer into this document.
  absl::StatusOr<const Json*> RefTarget(const Json& s, const std::string& path) const;
  // `s` with its $refs into the document followed (null where RefTarget refuses one).
  const Json* Resolved(const Json& s) const;
  // additionalProperties, or its default: false under `strict`, true otherwise.
  Json AdditionalProperties(const Json& s) const {
    return s.value("additionalProperties", Json(!options_.strict));
  }
  // Whether every branch is an object requiring one property whose const or enum values no other
  // branch shares (pydantic's discriminated unions): a value valid for one branch then fails the
  // others, so oneOf is anyOf.
  bool Discriminated(const Json& branches) const;
  absl::Status CheckOneOfDisjoint(const Json& branches, const std::string& path);
  absl::StatusOr<std::vector<std::string>> Types(const Json& s, const std::string& path);
  absl::StatusOr<int32_t> Typed(const Json& s, const std::string& type, const std::string& path,
                                int depth);
  absl::StatusOr<int32_t> Object(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> Properties(const Json& s, const std::string& path, int depth, int64_t min,
                                     int64_t max);
  // dependentRequired, and draft 7's dependencies with arrays: makes the dependents of every
  // writable trigger required, or leaves out a trigger whose dependent cannot be written.
  // `extra` is the object's additionalProperties (AdditionalProperties).
  absl::Status Dependencies(const Json& s, const Json& properties, const Json& extra,
                            const std::string& path, std::vector<std::string>& names,
                            absl::flat_hash_set<std::string>& required);
  // The rule of the keys propertyNames allows: JSON strings.
  absl::StatusOr<int32_t> PropertyNames(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> Array(const Json& s, const std::string& path, int depth);
  // Positions `items_key` (an array of schemas), then `rest_key` (a schema; any value without).
  absl::StatusOr<int32_t> Tuple(const Json& s, const char* items_key, const char* rest_key,
                                const std::string& path, int depth, int64_t min, int64_t max);
  absl::StatusOr<int32_t> String(const Json& s, const std::string& path);
  absl::StatusOr<int32_t> Pattern(const Json& s, const std::string& path);
  // A JSON string whose decoded value `regex` matches (as `match` says): `pattern` and the
  // formats written by a regex.
  absl::StatusOr<int32_t> RegexString(const std::string& regex, RegexMatch match);
  absl::StatusOr<int32_t> Integer(const Json& s, const std::string& path);
  absl::StatusOr<std::pair<int64_t, int64_t>> IntegerBounds(const Json& s, const std::string& path);
  absl::StatusOr<int32_t> Multiples(const Json& s, const std::string& path);
  absl::StatusOr<int32_t> Number(const Json& s, const std::string& path);

  const Json& root_;
  const JsonSchemaOptions& options_;
  GrammarBuilder& b_;
  JsonRules& json_;
  absl::flat_hash_map<std::string, int32_t> refs_;  // "$ref" value -> its rule
  size_t distributed_bytes_ = 0;  // of keywords copied into choice branches, bounded
};

absl::StatusOr<int32_t> SchemaCompiler::Compile(const Json& s, const std::string& path, int depth) {
  if (depth > kMaxDepth) return Invalid(path, absl::StrCat("nested deeper than ", kMaxDepth));
  RETURN_IF_ERROR(b_.CheckBudget());  // each subschema adds a bounded amount: stop at the budget
  if (s.is_boolean()) {
    if (!s.get<bool>()) return Unsatisfiable(path, "the schema is false");
    return json_.AnyValue();
  }
  if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) {
    if (!IsSupported(key) && !IsAnnotation(key)) {
      return Invalid(path, absl::StrCat("keyword '", key, "' is not supported"));
    }
  }
  if (s.contains("allOf")) return AllOf(s, path, depth);
  if (s.contains("$ref")) return Reference(s, path, depth);
  if (s.contains("enum") || s.contains("const")) return Enum(s, path);
  if (s.contains("anyOf") || s.contains("oneOf")) return Choice(s, path, depth);
  if (s.contains("not")) return Not(s, path, depth);
  ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(s, path));
  if (types.empty()) return json_.AnyValue();
  const int32_t rule = b_.NewRule("typed");
  for (const std::string& type : types) {
    ASSIGN_OR_RETURN(const int32_t t, Typed(s, type, path, depth));
    b_.AddAlternative(rule, {B::Ref(t)});
  }
  return rule;
}

absl::StatusOr<int32_t> SchemaCompiler::CompileOrAny(const Json& s, const char* key,
                                                     const std::string& path, int depth) {
  auto it = s.find(key);
  if (it == s.end()) return json_.AnyValue();
  return Compile(*it, absl::StrCat(path, "/", key), depth + 1);
}

// Only with annotations beside it: the draft-2020 meaning of other keywords next to $ref (both
// apply) is not compiled.
absl::StatusOr<int32_t> SchemaCompiler::Reference(const Json& s, const std::string& path,
                                                  int depth) {
  ASSIGN_OR_RETURN(const Json* target, RefTarget(s, path));
  const std::string ref = s["$ref"].get<std::string>();
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const int32_t rule = b_.NewRule("ref");
  refs_[ref] = rule;  // before compiling the target: it may refer to itself
  ASSIGN_OR_RETURN(const int32_t body, Compile(*target, ref.substr(1), depth + 1));
  b_.AddAlternative(rule, {B::Ref(body)});
  return rule;
}

absl::StatusOr<const Json*> SchemaCompiler::RefTarget(const Json& s,
                                                      const std::string& path) const {
  for (const auto& [key, value] : s.items()) {
    if (key != "$ref" && !IsAnnotation(key)) {
      return Invalid(path, absl::StrCat("keyword '", key, "' beside $ref is not supported"));
    }
  }
  if (!s["$ref"].is_string()) return Invalid(path, "$ref must be a string");
  const std::string ref = s["$ref"].get<std::string>();
  if (ref == "#") return &root_;
  if (ref.rfind("#/", 0) != 0) {
    return Invalid(path, absl::StrCat("$ref '", ref, "' does not point into this schema"));
  }
  // nlohmann throws on a malformed pointer ("~" not followed by 0 or 1, a bad array index): on a
  // request thread that would end the process, so every way it fails is an answer.
  try {
    const Json::json_pointer pointer(ref.substr(1));
    if (!root_.contains(pointer)) {
      return Invalid(path, absl::StrCat("$ref '", ref, "' points at nothing"));
    }
    return &root_.at(pointer);
  } catch (const nlohmann::json::exception& e) {
    return Invalid(path, absl::StrCat("$ref '", ref, "' is not a JSON pointer: ", e.what()));
  }
}

absl::StatusOr<int32_t> SchemaCompiler::Enum(const Json& s, const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<Json> values, EnumValues(s, path));
  std::vector<std::string> texts;
  texts.reserve(values.size());
  for (const Json& v : values) texts.push_back(v.dump());
  return json_.LiteralChoice("enum", std::move(texts));
}

absl::StatusOr<std::vector<Json>> SchemaCompiler::EnumValues(const Json& s,
                                                             const std::string& path) {
  for (const auto& [key, value] : s.items()) {
    if (key != "enum" && key != "const" && key != "type" && !IsAnnotation(key)) {
      return Invalid(path,
                     absl::StrCat("keyword '", key, "' beside enum or const is not supported"));
    }
  }
  if (s.contains("enum") && s.contains("const")) return Invalid(path, "both enum and const");
  Json values = s.contains("const") ? Json::array({s["const"]}) : s["enum"];
  if (!values.is_array()) return Invalid(path, "enum must be an array");
  ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(s, path));
  std::vector<Json> typed_values;
  for (const Json& v : values) {
    bool typed = types.empty();
    for (const std::string& t : TypesOf(v)) {
      typed = typed || std::find(types.begin(), types.end(), t) != types.end();
    }
    if (typed) typed_values.push_back(v);
  }
  if (typed_values.empty()) return Unsatisfiable(path, "no enum value has the schema's type");
  return typed_values;
}

// allOf of one schema (what pydantic v1 writes to give a $ref field a description): that schema.
// Of object schemas of properties and required names only, with such siblings (a model extending
// another, zod's .and(), a TypeScript interface's extends): one object with every property and
// every required name; an object valid for the merge is valid for each, since none limits the
// properties the others add. Anything else would need an intersection the grammar cannot build.
absl::StatusOr<int32_t> SchemaCompiler::AllOf(const Json& s, const std::string& path, int depth) {
  const Json& all = s["allOf"];
  if (!all.is_array() || all.empty()) return Invalid(path, "allOf must be a non-empty array");
  bool siblings = false;
  for (const auto& [k, value] : s.items())
    siblings = siblings || (k != "allOf" && !IsAnnotation(k));
  if (all.size() == 1 && !siblings) return Compile(all[0], path + "/allOf/0", depth + 1);
  Json merged = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
  RETURN_IF_ERROR(MergeObject(s, path, depth, merged));
  if (merged["properties"].empty()) merged.erase("properties");
  if (merged["required"].empty()) merged.erase("required");
  return Compile(merged, path, depth + 1);
}

absl::Status SchemaCompiler::MergeObject(const Json& s, const std::string& path, int depth,
                                         Json& merged) {
  const auto cannot = [&path](absl::string_view why) {
    return Invalid(path, absl::StrCat("keyword 'allOf' is supported with one schema, or with "
                                      "object schemas of properties and required names only "
                                      "(the grammar cannot intersect others): ",
                                      why));
  };
  if (depth > kMaxDepth) return Invalid(path, absl::StrCat("nested deeper than ", kMaxDepth));
  if (s.is_boolean()) return s.get<bool>() ? absl::OkStatus() : Unsatisfiable(path, "false");
  if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
  if (s.contains("$ref")) {
    ASSIGN_OR_RETURN(const Json* target, RefTarget(s, path));
    return MergeObject(*target, s["$ref"].get<std::string>().substr(1), depth + 1, merged);
  }
  for (const auto& [k, v] : s.items()) {
    if (IsAnnotation(k)) continue;
    if (k == "allOf") {
      if (!v.is_array()) return Invalid(path, "allOf must be a non-empty array");
      for (size_t i = 0; i < v.size(); ++i) {
        RETURN_IF_ERROR(MergeObject(v[i], absl::StrCat(path, "/allOf/", i), depth + 1, merged));
      }
    } else if (k == "type") {
      if (v != "object") return cannot(absl::StrCat("its type is ", v.dump(), ", not \"object\""));
    } else if (k == "properties") {
      if (!v.is_object()) return Invalid(path, "properties must be an object");
      for (const auto& [name, schema] : v.items()) {
        Json& into = merged["properties"];
        if (into.contains(name) && into[name] != schema) {
          return cannot(absl::StrCat("property '", name, "' has two different schemas"));
        }
        into[name] = schema;
      }
    } else if (k == "required") {
      if (!v.is_array()) return Invalid(path, "required must be an array");
      if (!absl::c_all_of(v, [](const Json& name) { return name.is_string(); })) {
        return Invalid(path, "required must be an array of strings");
      }
      AppendMissing(v, merged["required"]);
    } else {
      return cannot(absl::StrCat("it has keyword '", k, "'"));
    }
  }
  return absl::OkStatus();
}

// not: of false, nothing excluded; of {} or true (zod's never), no value; of a type (with
// annotations), the other types. An excluded integer excludes every number (the grammar cannot
// write the non-integral ones apart): a subset of the valid values. Any other `not` would need
// a complement the grammar cannot build.
absl::StatusOr<int32_t> SchemaCompiler::Not(const Json& s, const std::string& path, int depth) {
  const Json& n = s["not"];
  Json rest = s;
  rest.erase("not");
  if (IsFalse(n)) return Compile(rest, path, depth + 1);
  if (IsFalse(s)) return Unsatisfiable(path, "'not' of a schema every value satisfies");
  if (!n.is_object()) return Invalid(path, "not must be a schema");
  for (const auto& [k, value] : n.items()) {
    if (k != "type" && !IsAnnotation(k)) {
      return Invalid(path,
                     "keyword 'not' is supported with a type, {}, true or false only (the "
                     "grammar cannot build other complements)");
    }
  }
  if (!n.contains("type")) return Unsatisfiable(path, "'not' of a schema every value satisfies");
  ASSIGN_OR_RETURN(const std::vector<std::string> excluded, Types(n, path + "/not"));
  ASSIGN_OR_RETURN(std::vector<std::string> allowed, Types(rest, path));
  if (allowed.empty()) allowed.assign(kKinds.begin(), kKinds.end());
  const bool numbers_out =
      absl::c_linear_search(excluded, "integer") || absl::c_linear_search(excluded, "number");
  Json kept = Json::array();
  for (const std::string& t : allowed) {
    if (absl::c_linear_search(excluded, t)) continue;
    if (numbers_out && (t == "number" || t == "integer")) continue;
    kept.push_back(t);
  }
  if (kept.empty()) return Invalid(path, "'not' leaves no type the grammar can write");
  rest["type"] = std::move(kept);
  return Compile(rest, path, depth + 1);
}

absl::StatusOr<int32_t> SchemaCompiler::Choice(const Json& s, const std::string& path, int depth) {
  const bool one_of = s.contains("oneOf");
  const char* key = one_of ? "oneOf" : "anyOf";
  ASSIGN_OR_RETURN(std::optional<Json> distributed, Distributed(s, key, path));
  if (distributed.has_value()) return Choice(*distributed, path, depth + 1);
  const Json& branches = s[key];
  if (!branches.is_array() || branches.empty()) {
    return Invalid(path, absl::StrCat(key, " must be a non-empty array"));
  }
  const auto live =
      std::count_if(branches.begin(), branches.end(), [](const Json& b) { return !IsFalse(b); });
  if (one_of && live > 1 && !Discriminated(branches)) {
    RETURN_IF_ERROR(CheckOneOfDisjoint(branches, path));
  }
  const int32_t rule = b_.NewRule(key);
  bool any_branch = false;
  for (size_t i = 0; i < branches.size(); ++i) {
    const std::string branch_path = absl::StrCat(path, "/", key, "/", i);
    if (IsFalse(branches[i])) continue;  // no value is valid for it: nothing to write
    any_branch = true;
    ASSIGN_OR_RETURN(const int32_t r, Compile(branches[i], branch_path, depth + 1));
    b_.AddAlternative(rule, {B::Ref(r)});
  }
  if (!any_branch) return Unsatisfiable(path, absl::StrCat("every branch of ", key, " is false"));
  return rule;
}

// oneOf's branches each with a type of its own: no value is valid for two of them.
// Keywords beside a choice apply to every branch: S and (B1 or B2) is (S and B1) or (S and B2),
// and oneOf's exactly-one is kept since S is common. Each (S and Bi) is the one schema of both
// keywords, where no keyword is in both with different values (`required` is their union,
// `type` their common types) and neither side's keywords read the other's (additionalProperties
// covers what `properties` leaves out: written beside the other's properties, it would cover
// less).
absl::StatusOr<std::optional<Json>> SchemaCompiler::Distributed(const Json& s, const char* key,
                                                                const std::string& path) {
  Json siblings = Json::object();
  Json choice = Json::object();
  for (const auto& [k, value] : s.items()) {
    (k != key && !IsAnnotation(k) ? siblings : choice)[k] = value;
  }
  if (siblings.empty()) return std::nullopt;
  const Json& branches = s[key];
  if (!branches.is_array() || branches.empty()) {
    return Invalid(path, absl::StrCat(key, " must be a non-empty array"));
  }
  // Each branch gets a copy: bounded, so a schema of nested choices cannot make the copies grow
  // without end before the grammar's own budget is reached.
  distributed_bytes_ += siblings.dump().size() * branches.size();
  if (distributed_bytes_ > (4u << 20)) {
    return Invalid(path, absl::StrCat("the keywords beside ", key,
                                      " would be copied into its branches past 4 MiB"));
  }
  Json merged = Json::array();
  for (size_t i = 0; i < branches.size(); ++i) {
    ASSIGN_OR_RETURN(Json branch,
                     WithSiblings(branches[i], siblings, absl::StrCat(path, "/", key, "/", i)));
    merged.push_back(std::move(branch));
  }
  choice[key] = std::move(merged);
  return choice;
}

absl::StatusOr<Json> SchemaCompiler::WithSiblings(const Json& branch, const Json& siblings,
                                                  const std::string& path) {
  if (IsFalse(branch)) return Json(false);
  if (branch.is_boolean()) return siblings;
  const Json* resolved = Resolved(branch);
  if (resolved == nullptr || !resolved->is_object()) return branch;  // Compile says why
  Json out = *resolved;
  const auto reads = [](const Json& a, const Json& b) {
    return (a.contains("additionalProperties") &&
            (b.contains("properties") || b.contains("patternProperties"))) ||
           (a.contains("additionalItems") && b.contains("items")) ||
           (a.contains("items") && b.contains("prefixItems"));
  };
  if (reads(out, siblings) || reads(siblings, out)) {
    return Invalid(path,
                   "the keywords beside the choice and this branch's would change each "
                   "other's meaning (additionalProperties or additionalItems beside the "
                   "other's properties or items): write them in each branch");
  }
  for (const auto& [k, value] : siblings.items()) {
    if (!out.contains(k)) {
      out[k] = value;
    } else if (k == "required" && value.is_array() && out[k].is_array()) {
      AppendMissing(value, out[k]);
    } else if (k == "type") {
      ASSIGN_OR_RETURN(const std::vector<std::string> mine, Types(siblings, path));
      ASSIGN_OR_RETURN(const std::vector<std::string> theirs, Types(out, path));
      std::vector<std::string> common;
      for (const char* t : kKinds) {
        if (absl::c_linear_search(mine, t) && absl::c_linear_search(theirs, t)) {
          common.push_back(t);
        }
      }
      // An integer is a number too: integers are common unless every number is.
      const auto numeric = [](const std::vector<std::string>& types) {
        return absl::c_linear_search(types, "integer") || absl::c_linear_search(types, "number");
      };
      if (!absl::c_linear_search(common, "number") && numeric(mine) && numeric(theirs)) {
        common.push_back("integer");
      }
      if (common.empty()) return Json(false);  // no value has both types
      out[k] = common;
    } else if (out[k] != value) {
      return Invalid(path, absl::StrCat("keyword '", k,
                                        "' beside the choice and in this branch "
                                        "with another value is not supported"));
    }
  }
  return out;
}

absl::Status SchemaCompiler::CheckOneOfDisjoint(const Json& branches, const std::string& path) {
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < branches.size(); ++i) {
    if (IsFalse(branches[i])) continue;
    const std::string branch_path = absl::StrCat(path, "/oneOf/", i);
    ASSIGN_OR_RETURN(std::vector<std::string> types, Types(branches[i], branch_path));
    if (std::find(types.begin(), types.end(), "number") != types.end()) {
      types.push_back("integer");  // every integer is a number
    }
    bool disjoint = !types.empty();
    for (const std::string& t : types) disjoint = seen.insert(t).second && disjoint;
    if (!disjoint) {
      return Invalid(branch_path,
                     "oneOf is supported only when each branch has a type of its own, or each is "
                     "an object whose required property of const or enum values tells it apart "
                     "(an answer valid for two branches would be invalid)");
    }
  }
  return absl::OkStatus();
}

const Json* SchemaCompiler::Resolved(const Json& s) const {
  const Json* at = &s;
  for (int hops = 0; hops < kMaxDepth && at->is_object() && at->contains("$ref"); ++hops) {
    absl::StatusOr<const Json*> target = RefTarget(*at, "");
    if (!target.ok()) return nullptr;  // Reference() reports it where the schema is compiled
    at = *target;
  }
  return at;
}

bool SchemaCompiler::Discriminated(const Json& branches) const {
  // Each branch's object schema and required names; the candidates are the first one's.
  std::vector<const Json*> objects;
  std::vector<absl::flat_hash_set<std::string>> required_names;
  for (const Json& branch : branches) {
    if (IsFalse(branch)) continue;
    const Json* o = Resolved(branch);
    // Only objects are told apart (a branch of type ["object", "null"] writes a null that
    // another branch may take too).
    if (o == nullptr || !o->is_object() || !o->contains("required") ||
        !(*o)["required"].is_array() || !o->contains("properties") ||
        !(*o)["properties"].is_object() || o->value("type", Json("object")) != "object") {
      return false;
    }
    objects.push_back(o);
    absl::flat_hash_set<std::string>& names = required_names.emplace_back();
    for (const Json& r : (*o)["required"]) {
      if (r.is_string()) names.insert(r.get<std::string>());
    }
  }
  if (objects.empty()) return false;
  for (const std::string& p : required_names[0]) {
    absl::flat_hash_set<std::string> seen;  // every branch's values (EqualityKey)
    bool tells_apart = true;
    for (size_t b = 0; b < objects.size() && tells_apart; ++b) {
      const Json& properties = (*objects[b])["properties"];
      const Json* property = properties.contains(p) ? Resolved(properties[p]) : nullptr;
      if (!required_names[b].contains(p) || property == nullptr || !property->is_object()) {
        tells_apart = false;
        break;
      }
      const Json values = property->contains("const") ? Json::array({(*property)["const"]})
                                                      : property->value("enum", Json());
      if (!values.is_array() || values.empty()) {
        tells_apart = false;
        break;
      }
      for (const Json& v : values) {
        tells_apart = IsScalar(v) && seen.insert(EqualityKey(v)).second && tells_apart;
      }
    }
    if (tells_apart) return true;
  }
  return false;
}

// The schema's "type" as a list; without one, the type its keywords imply (an object's for
// properties, ...), or none (any value).
absl::StatusOr<std::vector<std::string>> SchemaCompiler::Types(const Json& s,
                                                               const std::string& path) {
  if (!s.is_object()) return std::vector<std::string>{};
  auto it = s.find("type");
  if (it == s.end()) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
        s.contains("propertyNames") || s.contains("minProperties") || s.contains("maxProperties") ||
        s.contains("dependentRequired") || s.contains("dependencies") ||
        s.contains("patternProperties")) {
      return std::vector<std::string>{"object"};
    }
    if (s.contains("items") || s.contains("additionalItems") || s.contains("prefixItems") ||
        s.contains("minItems") || s.contains("maxItems") || s.contains("uniqueItems")) {
      return std::vector<std::string>{"array"};
    }
    if (s.contains("minLength") || s.contains("maxLength") || s.contains("format") ||
        s.contains("pattern")) {
      return std::vector<std::string>{"string"};
    }
    // Bounds without a type: numbers within them rather than any value (which could be a number
    // outside them).
    for (const char* bound : kBounds) {
      if (s.contains(bound)) return std::vector<std::string>{"number"};
    }
    if (s.contains("multipleOf")) return std::vector<std::string>{"number"};
    return std::vector<std::string>{};
  }
  std::vector<std::string> types;
  for (const Json& t : it->is_array() ? *it : Json::array({*it})) {
    if (!t.is_string()) return Invalid(path, "type must be a string or an array of strings");
    const std::string name = t.get<std::string>();
    if (name != "integer" && !absl::c_linear_search(kKinds, name)) {
      return Invalid(path, absl::StrCat("unknown type '", name, "'"));
    }
    types.push_back(name);
  }
  if (types.empty()) return Unsatisfiable(path, "type is an empty list");
  return types;
}

absl::StatusOr<int32_t> SchemaCompiler::Typed(const Json& s, const std::string& type,
                                              const std::string& path, int depth) {
  if (type == "string") return String(s, path);
  if (type == "integer") return Integer(s, path);
  if (type == "number") return Number(s, path);
  if (type == "boolean") return json_.Boolean();
  if (type == "null") return json_.Null();
  if (type == "object") return Object(s, path, depth);
  if (type == "array") return Array(s, path, depth);
  return Invalid(path, absl::StrCat("unknown type '", type, "'"));
}

absl::StatusOr<int32_t> SchemaCompiler::Object(const Json& s, const std::string& path, int depth) {
  ASSIGN_OR_RETURN(const int64_t min, Count(s, "minProperties", 0, path));
  ASSIGN_OR_RETURN(const int64_t max, Count(s, "maxProperties", -1, path));
  if (max >= 0 && min > max) return Unsatisfiable(path, "minProperties > maxProperties");
  const bool has_properties = (s.contains("properties") && !s["properties"].empty()) ||
                              (s.contains("required") && !s["required"].empty());
  if (s.contains("patternProperties")) return PatternMap(s, path, depth, min, max, has_properties);
  if (!has_properties && (s.contains("dependentRequired") || s.contains("dependencies"))) {
    return Invalid(path,
                   "dependentRequired or dependencies without declared properties is not "
                   "supported");
  }
  if (has_properties) {
    if (s.contains("propertyNames")) {
      return Invalid(path, "propertyNames beside properties or required is not supported");
    }
    return Properties(s, path, depth, min, max);
  }
  const Json extra = AdditionalProperties(s);
  const bool none = IsFalse(extra) || IsFalse(s.value("propertyNames", Json(true)));
  if (none || max == 0) {
    if (min > 0) return Unsatisfiable(path, "minProperties > 0 but no property is allowed");
    return EmptyObject();
  }
  if (min > 1) {
    // The grammar may repeat a key, which validators count once (they keep the last value).
    return Invalid(path,
                   "minProperties above 1 on an object without declared properties is not "
                   "supported");
  }
  ASSIGN_OR_RETURN(const int32_t value, Compile(extra, path + "/additionalProperties", depth + 1));
  int32_t key = -1;  // any string
  if (s.contains("propertyNames")) {
    ASSIGN_OR_RETURN(key, PropertyNames(s["propertyNames"], path + "/propertyNames", depth));
  }
  return json_.Map("map", value, key, min, max);
}

// A written trigger needs its dependents. Each dependent of a trigger that can be written is
// written always (required: a subset of the valid texts, and it keeps every property writable); a
// trigger whose dependent cannot be written (a false schema, or undeclared where
// additionalProperties forbids it) is left out, or the schema is unsatisfiable if it is required.
absl::Status SchemaCompiler::Dependencies(const Json& s, const Json& properties, const Json& extra,
                                          const std::string& path, std::vector<std::string>& names,
                                          absl::flat_hash_set<std::string>& required) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rules;  // trigger -> dependents
  for (const char* key : {"dependentRequired", "dependencies"}) {
    if (!s.contains(key)) continue;
    if (!s[key].is_object()) return Invalid(path, absl::StrCat("'", key, "' must be an object"));
    for (const auto& [trigger, dependents] : s[key].items()) {
      if (!dependents.is_array()) {
        return Invalid(path, absl::StrCat("'", key,
                                          "' with a schema (dependentSchemas) is not "
                                          "supported: only lists of property names"));
      }
      std::vector<std::string> list;
      for (const Json& d : dependents) {
        if (!d.is_string()) return Invalid(path, absl::StrCat("'", key, "' must list strings"));
        list.push_back(d.get<std::string>());
      }
      rules.emplace_back(trigger, std::move(list));
    }
  }
  auto writable = [&](const std::string& name) {
    return properties.contains(name) ? !IsFalse(properties.at(name)) : !IsFalse(extra);
  };
  for (bool changed = true; changed;) {  // each pass requires or removes a name, or ends
    changed = false;
    for (const auto& [trigger, dependents] : rules) {
      if (std::find(names.begin(), names.end(), trigger) == names.end()) continue;
      for (const std::string& d : dependents) {
        if (d == trigger || required.contains(d)) continue;
        changed = true;
        if (!writable(d)) {
          if (required.contains(trigger)) {
            return Unsatisfiable(path, absl::StrCat("'", trigger, "' is required and needs '", d,
                                                    "', which cannot be written"));
          }
          std::erase(names, trigger);
          break;
        }
        required.insert(d);
        if (std::find(names.begin(), names.end(), d) == names.end()) names.push_back(d);
      }
    }
  }
  return absl::OkStatus();
}

// propertyNames: a schema of strings (type, enum, const, pattern, lengths, format, or a $ref to
// one), compiled as a string schema. A map may repeat a key (JSON allows it; validators keep the
// last, so a repeat counts once: Object refuses minProperties above 1 on a map).
int32_t SchemaCompiler::EmptyObject() {
  const int32_t ws = json_.Whitespace();
  return b_.AddRule("empty_object",
                    {{B::Bytes(ByteSet::Of("{")), B::Ref(ws), B::Bytes(ByteSet::Of("}"))}});
}

// patternProperties of one pattern on an object without declared properties: a map whose keys
// match the pattern and whose values follow its schema. additionalProperties never applies to a
// key the pattern matches, so the map is valid whatever it says. Declared properties (a name
// could match the pattern and need both schemas), several patterns (a key could match two) and
// propertyNames beside it are refused.
absl::StatusOr<int32_t> SchemaCompiler::PatternMap(const Json& s, const std::string& path,
                                                   int depth, int64_t min, int64_t max,
                                                   bool has_properties) {
  const Json& patterns = s["patternProperties"];
  if (!patterns.is_object()) return Invalid(path, "patternProperties must be an object");
  if (patterns.empty()) {
    Json rest = s;
    rest.erase("patternProperties");
    return Object(rest, path, depth);
  }
  if (has_properties || s.contains("propertyNames") || s.contains("dependentRequired") ||
      s.contains("dependencies")) {
    return Invalid(path,
                   "patternProperties beside properties, required, propertyNames or "
                   "dependencies is not supported");
  }
  if (patterns.size() > 1) {
    return Invalid(path,
                   "patternProperties of more than one pattern is not supported (a key could "
                   "match several and need each schema)");
  }
  if (min > 1) {
    // As for any map: the grammar may repeat a key, which validators count once.
    return Invalid(path, "minProperties above 1 beside patternProperties is not supported");
  }
  const auto entry = patterns.items().begin();
  const std::string pattern_path = absl::StrCat(path, "/patternProperties");
  if (IsFalse(entry.value()) || max == 0) {
    if (min > 0) return Invalid(path, "minProperties beside a false patternProperties schema");
    return EmptyObject();
  }
  ASSIGN_OR_RETURN(const int32_t key, Compile(Json{{"type", "string"}, {"pattern", entry.key()}},
                                              pattern_path, depth + 1));
  ASSIGN_OR_RETURN(const int32_t value,
                   Compile(entry.value(), absl::StrCat(pattern_path, "/", entry.key()), depth + 1));
  return json_.Map("map", value, key, min, max);
}

absl::StatusOr<int32_t> SchemaCompiler::PropertyNames(const Json& s, const std::string& path,
                                                      int depth) {
  if (s.is_boolean()) return json_.String(0, -1);  // true (false was handled by the caller)
  const Json* resolved = Resolved(s);
  if (resolved == nullptr || !resolved->is_object()) {
    return Invalid(path, "propertyNames must be a schema object");
  }
  Json names = *resolved;
  for (const char* key : {"anyOf", "oneOf", "allOf", "$ref"}) {
    if (names.contains(key)) {
      return Invalid(path, absl::StrCat("propertyNames with '", key,
                                        "' is not supported (a string schema is)"));
    }
  }
  if (!names.contains("type")) names["type"] = "string";
  if (names["type"] != "string") return Invalid(path, "propertyNames must describe strings");
  return Compile(names, path, depth + 1);
}

// An object of the declared properties, in the schema's order, the required ones always and each
// optional one or not: after_[i][first] writes properties i.. (first: no comma before the first).
absl::StatusOr<int32_t> SchemaCompiler::Properties(const Json& s, const std::string& path,
                                                   int depth, int64_t min, int64_t max) {
  const Json properties = s.value("properties", Json::object());
  if (!properties.is_object()) return Invalid(path, "properties must be an object");
  const Json required_list = s.value("required", Json::array());
  if (!required_list.is_array()) return Invalid(path, "required must be an array");
  std::vector<std::string> names;
  absl::flat_hash_set<std::string> required;
  for (const auto& [name, schema] : properties.items()) names.push_back(name);
  for (const Json& r : required_list) {
    if (!r.is_string()) return Invalid(path, "required must list strings");
    const std::string& name = r.get_ref<const std::string&>();
    if (required.insert(name).second && !properties.contains(name)) names.push_back(name);
  }
  // A property whose schema is false may not appear: it is never written.
  for (const std::string& name : required) {
    if (properties.contains(name) && IsFalse(properties.at(name))) {
      return Unsatisfiable(path, absl::StrCat("'", name, "' is required but its schema is false"));
    }
  }
  std::erase_if(names, [&](const std::string& name) {
    return properties.contains(name) && IsFalse(properties.at(name));
  });
  // A required name with no schema of its own takes additionalProperties' (JSON Schema's rule).
  const Json extra = AdditionalProperties(s);
  RETURN_IF_ERROR(Dependencies(s, properties, extra, path, names, required));
  // Only the declared properties are written, from the required ones to all: a count bound
  // inside that range would need counting, one outside it is unsatisfiable or no constraint.
  const auto least = static_cast<int64_t>(required.size());
  const auto most = static_cast<int64_t>(names.size());
  if (min > most && !IsFalse(extra)) {
    return Invalid(path,
                   "minProperties above the declared properties is not supported (only "
                   "declared properties are written)");
  }
  if (min > most || (max >= 0 && max < least)) {
    return Unsatisfiable(path,
                         "minProperties or maxProperties leaves no room for the declared "
                         "and required properties");
  }
  if (min > least || (max >= 0 && max < most)) {
    return Invalid(path,
                   "minProperties or maxProperties between the required and the declared "
                   "properties' counts is not supported");
  }
  // Each optional property may be the first written: one parse stack each at the opening brace,
  // and the matcher follows at most StackSet::kMaxStacks.
  const auto optional = static_cast<int64_t>(names.size() - required.size());
  if (optional > kMaxOptionalProperties) {
    return Invalid(path, absl::StrCat(optional, " optional properties; at most ",
                                      kMaxOptionalProperties, " are supported in one object"));
  }
  const Symbol ws = B::Ref(json_.Whitespace());
  const Symbol comma = B::Bytes(ByteSet::Of(","));
  std::vector<int32_t> members;
  for (const std::string& name : names) {
    if (!properties.contains(name) && IsFalse(extra)) {
      return Unsatisfiable(
          path, absl::StrCat("'", name, "' is required but additionalProperties forbids it"));
    }
    ASSIGN_OR_RETURN(
        const int32_t value,
        properties.contains(name)
            ? Compile(properties.at(name), absl::StrCat(path, "/properties/", name), depth + 1)
            : Compile(extra, path + "/additionalProperties", depth + 1));
    Alternative member = B::Literal(Json(name).dump());
    member.insert(member.end(), {ws, B::Bytes(ByteSet::Of(":")), ws, B::Ref(value), ws});
    members.push_back(b_.AddRule("member", {std::move(member)}));
  }
  std::array<int32_t, 2> after{b_.AddRule("no_more", {{}}), -1};
  after[1] = after[0];
  for (size_t i = names.size(); i-- > 0;) {
    std::array<int32_t, 2> here{};
    for (const bool first : {false, true}) {
      Alternative with = first ? Alternative{} : Alternative{comma, ws};
      with.insert(with.end(), {B::Ref(members[i]), B::Ref(after[0])});
      std::vector<Alternative> alternatives{std::move(with)};
      if (!required.contains(names[i])) alternatives.push_back({B::Ref(after[first])});
      here[first] = b_.AddRule("properties", std::move(alternatives));
    }
    after = here;
  }
  return b_.AddRule(
      "object", {{B::Bytes(ByteSet::Of("{")), ws, B::Ref(after[1]), B::Bytes(ByteSet::Of("}"))}});
}

absl::StatusOr<int32_t> SchemaCompiler::Array(const Json& s, const std::string& path, int depth) {
  ASSIGN_OR_RETURN(const int64_t min, Count(s, "minItems", 0, path));
  ASSIGN_OR_RETURN(const int64_t max, Count(s, "maxItems", -1, path));
  if (max >= 0 && min > max) return Unsatisfiable(path, "minItems > maxItems");
  const Json unique = s.value("uniqueItems", Json(false));
  if (!unique.is_boolean()) return Invalid(path, "'uniqueItems' must be a boolean");
  const bool no_items = s.contains("items") && IsFalse(s["items"]) && !s.contains("prefixItems");
  // At most one item (or none) is always unique.
  if (unique.get<bool>() && (max < 0 || max > 1) && !no_items) {
    return UniqueArray(s, path, min, max);
  }
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) return Invalid(path, "prefixItems must be an array");
    if (DeclaresDraftBefore2019(root_)) {
      return Invalid(path,
                     "prefixItems is a draft 2020-12 keyword, and the schema declares an "
                     "earlier draft ($schema), where items applies to every item");
    }
    if (s.contains("additionalItems") || (s.contains("items") && s["items"].is_array())) {
      return Invalid(path,
                     "prefixItems beside additionalItems or an array of items (draft 7's tuple) "
                     "is not supported: draft 2020-12 writes the rest's schema as items");
    }
    return Tuple(s, "prefixItems", "items", path, depth, min, max);
  }
  if (s.contains("items") && s["items"].is_array()) {
    return Tuple(s, "items", "additionalItems", path, depth, min, max);
  }
  if (no_items) {  // no item is valid: only the empty array
    if (min > 0) return Unsatisfiable(path, "minItems > 0 but items is false");
    const int32_t ws = json_.Whitespace();
    return b_.AddRule("empty_array",
                      {{B::Bytes(ByteSet::Of("[")), B::Ref(ws), B::Bytes(ByteSet::Of("]"))}});
  }
  ASSIGN_OR_RETURN(const int32_t item, CompileOrAny(s, "items", path, depth));
  return json_.Array("array", item, min, max);
}

// uniqueItems over items of enum or const values (pydantic's set[Literal[...]] and set[SomeEnum]):
// each value at most once, in the enum's order. Other items would need every pair of items
// compared, which a grammar cannot do.
absl::StatusOr<int32_t> SchemaCompiler::UniqueArray(const Json& s, const std::string& path,
                                                    int64_t min, int64_t max) {
  // Each value may come first: one parse stack each (as optional properties), and the matcher
  // follows at most StackSet::kMaxStacks.
  constexpr int64_t kMaxValues = kMaxOptionalProperties;
  const Json* items =
      s.contains("items") && !s.contains("prefixItems") ? Resolved(s["items"]) : nullptr;
  if (items == nullptr || !items->is_object() ||
      !(items->contains("enum") || items->contains("const"))) {
    return Invalid(path,
                   "uniqueItems is supported only when items are enum or const values (or "
                   "maxItems is at most 1)");
  }
  ASSIGN_OR_RETURN(const std::vector<Json> values, EnumValues(*items, path + "/items"));
  std::vector<int32_t> rules;
  absl::flat_hash_set<std::string> seen;
  for (const Json& v : values) {
    if (!IsScalar(v)) {
      return Invalid(path, "uniqueItems over object or array values is not supported");
    }
    if (seen.insert(EqualityKey(v)).second) {
      rules.push_back(b_.AddRule("unique_value", {B::Literal(v.dump())}));
    }
  }
  const auto n = static_cast<int64_t>(rules.size());
  if (n > kMaxValues) {
    return Invalid(path, absl::StrCat("uniqueItems over ", n, " values; at most ", kMaxValues,
                                      " are supported"));
  }
  const std::optional<int32_t> rule = json_.Subsequence("unique", rules, min, max);
  if (!rule) {
    return Unsatisfiable(
        path, absl::StrCat("minItems is ", min, " but there are ", n, " distinct values"));
  }
  return *rule;
}

// Tuples: draft 7's items as an array with additionalItems, draft 2020-12's prefixItems with
// items. Position i follows the i-th schema, later positions the rest's schema (any value without
// it). A false schema ends the array before its position.
absl::StatusOr<int32_t> SchemaCompiler::Tuple(const Json& s, const char* items_key,
                                              const char* rest_key, const std::string& path,
                                              int depth, int64_t min, int64_t max) {
  const Json& items = s[items_key];
  const Json extra = s.value(rest_key, Json(true));
  int64_t longest = max;  // the most items it can hold (< 0: no bound)
  std::vector<int32_t> positions;
  for (size_t i = 0; i < items.size() && (max < 0 || static_cast<int64_t>(i) < max); ++i) {
    if (IsFalse(items[i])) {
      longest = static_cast<int64_t>(i);
      break;
    }
    ASSIGN_OR_RETURN(const int32_t item,
                     Compile(items[i], absl::StrCat(path, "/", items_key, "/", i), depth + 1));
    positions.push_back(item);
  }
  const auto n = static_cast<int64_t>(items.size());
  const bool has_extra =
      static_cast<int64_t>(positions.size()) == n && !IsFalse(extra) && (max < 0 || max > n);
  if (!has_extra) longest = static_cast<int64_t>(positions.size());
  if (longest >= 0 && min > longest) {
    return Unsatisfiable(
        path, absl::StrCat("minItems is ", min, " but at most ", longest, " items can be valid"));
  }
  int32_t extra_item = -1;
  if (has_extra) {
    ASSIGN_OR_RETURN(extra_item, Compile(extra, absl::StrCat(path, "/", rest_key), depth + 1));
  }
  return json_.Tuple("tuple", positions, extra_item, min, has_extra ? max : longest);
}

// minimum / maximum / exclusiveMinimum / exclusiveMaximum (draft 6+ numbers) as an integer range;
// bounds past what the integer grammar writes anyway (15 digits, e.g. JavaScript's safe-integer
// bounds that zod writes) change nothing.
// OpenAPI's numeric formats, which ajv-formats checks: int32 bounds an integer to 32 bits, int64
// to 64 (every integer written here fits), float and double take any number. A format beside a
// string type is the strings' (a date says nothing of an integer); any other is refused, never
// ignored.
absl::StatusOr<std::string> SchemaCompiler::NumericFormat(const Json& s, const std::string& path) {
  const auto it = s.find("format");
  if (it == s.end()) return std::string();
  if (!it->is_string()) return Invalid(path, "format must be a string");
  const std::string format = it->get<std::string>();
  if (format == "int32" || format == "int64" || format == "float" || format == "double") {
    return format;
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> types, Types(s, path));
  if (absl::c_linear_search(types, "string")) return std::string();
  return Invalid(path, absl::StrCat("format '", format,
                                    "' is not supported on numbers (int32, int64, float and "
                                    "double are)"));
}

absl::StatusOr<int32_t> SchemaCompiler::Integer(const Json& s, const std::string& path) {
  RETURN_IF_ERROR(NumericFormat(s, path).status());
  if (s.contains("multipleOf")) return Multiples(s, path);
  ASSIGN_OR_RETURN(const auto bounds, IntegerBounds(s, path));
  const auto [lo, hi] = bounds;
  if (lo == -JsonRules::kMaxInteger && hi == JsonRules::kMaxInteger) return json_.Integer();
  return json_.IntegerRange(lo, hi);
}

// The integers the bounds allow, [lo, hi] within the 15 digits the integer grammar writes.
absl::StatusOr<std::pair<int64_t, int64_t>> SchemaCompiler::IntegerBounds(const Json& s,
                                                                          const std::string& path) {
  constexpr int64_t kMax = JsonRules::kMaxInteger;
  double lo = -double(kMax), hi = double(kMax);
  if (const auto f = s.find("format"); f != s.end() && *f == "int32") {
    lo = -2147483648.0;
    hi = 2147483647.0;
  }
  for (const auto& [key, value] : s.items()) {
    const bool lower = key == "minimum" || key == "exclusiveMinimum";
    const bool upper = key == "maximum" || key == "exclusiveMaximum";
    if (!lower && !upper) continue;
    if (!value.is_number()) return Invalid(path, absl::StrCat("'", key, "' must be a number"));
    const double v = value.get<double>();
    const bool exclusive = key.rfind("exclusive", 0) == 0;
    if (lower) lo = std::max(lo, exclusive ? std::floor(v) + 1 : std::ceil(v));
    if (upper) hi = std::min(hi, exclusive ? std::ceil(v) - 1 : std::floor(v));
  }
  if (lo > hi) return Unsatisfiable(path, "no integer lies within its bounds");
  return std::pair{static_cast<int64_t>(std::max(lo, -double(kMax))),
                   static_cast<int64_t>(std::min(hi, double(kMax)))};
}

// multipleOf: the multiples within the bounds, written as integers for a number too (a subset of
// its valid texts). Only an integer divisor: validators divide in binary floating point, where
// 0.07 / 0.01 is not 7, so a fraction's multiples are not what they accept.
absl::StatusOr<int32_t> SchemaCompiler::Multiples(const Json& s, const std::string& path) {
  const Json& m = s["multipleOf"];
  if (!m.is_number() || !(m.get<double>() > 0)) {
    return Invalid(path, "'multipleOf' must be a number above 0");
  }
  const double k = m.get<double>();
  if (k != std::floor(k) || k > double(kMaxMultipleOf)) {
    return Invalid(
        path, absl::StrCat("'multipleOf' ", m.dump(),
                           " is not supported: only an integer from 1 to ", kMaxMultipleOf, " is"));
  }
  ASSIGN_OR_RETURN(const auto bounds, IntegerBounds(s, path));
  const std::optional<int32_t> rule =
      IntegerMultiples(b_, bounds.first, bounds.second, static_cast<int64_t>(k));
  if (!rule) {
    return Unsatisfiable(path,
                         absl::StrCat("no multiple of ", m.dump(), " lies within its bounds"));
  }
  return *rule;
}

// A number with bounds is a plain decimal within them (engine/grammar/number_range.h); without,
// any JSON number.
absl::StatusOr<int32_t> SchemaCompiler::Number(const Json& s, const std::string& path) {
  ASSIGN_OR_RETURN(const std::string format, NumericFormat(s, path));
  // ajv-formats' int32 and int64 take integers only, on a number too.
  if (format == "int32" || format == "int64") return Integer(s, path);
  if (s.contains("multipleOf")) return Multiples(s, path);
  std::optional<std::pair<double, bool>> lo, hi;  // (value, exclusive): the tightest of each side
  for (const auto& [key, value] : s.items()) {
    const bool lower = key == "minimum" || key == "exclusiveMinimum";
    const bool upper = key == "maximum" || key == "exclusiveMaximum";
    if (!lower && !upper) continue;
    if (!value.is_number()) return Invalid(path, absl::StrCat("'", key, "' must be a number"));
    const std::pair<double, bool> bound = {value.get<double>(), key.rfind("exclusive", 0) == 0};
    std::optional<std::pair<double, bool>>& side = lower ? lo : hi;
    const bool tighter = !side || (lower ? bound.first > side->first : bound.first < side->first) ||
                         (bound.first == side->first && bound.second);
    if (tighter) side = bound;
  }
  if (!lo && !hi) return json_.Number();
  std::optional<DecimalBound> low, high;
  if (lo) {
    ASSIGN_OR_RETURN(low, DecimalBoundOf(lo->first, lo->second));
  }
  if (hi) {
    ASSIGN_OR_RETURN(high, DecimalBoundOf(hi->first, hi->second));
  }
  const std::optional<int32_t> rule = NumberRange(b_, low, high);
  if (!rule) {
    return Unsatisfiable(path, "no number of at most 15 digits (without an exponent) lies within "
                               "its bounds");
  }
  return *rule;
}

absl::StatusOr<int32_t> SchemaCompiler::String(const Json& s, const std::string& path) {
  ASSIGN_OR_RETURN(const int64_t min, Count(s, "minLength", 0, path));
  ASSIGN_OR_RETURN(const int64_t max, Count(s, "maxLength", -1, path));
  if (max >= 0 && min > max) return Unsatisfiable(path, "minLength > maxLength");
  if (s.contains("pattern")) return Pattern(s, path);
  if (!s.contains("format")) return json_.String(min, max);
  if (s.contains("minLength") || s.contains("maxLength")) {
    return Invalid(path, "format together with minLength or maxLength is not supported");
  }
  const std::string format = s["format"].is_string() ? s["format"].get<std::string>() : "";
  if (format == "date") return json_.Date();
  if (format == "time") return json_.Time();
  if (format == "date-time") return json_.DateTime();
  if (format == "uuid") return json_.Uuid();
  if (IsRegexFormat(format)) {
    absl::StatusOr<int32_t> rule = RegexString(FormatRegexOf(format), RegexMatch::kWhole);
    if (!rule.ok()) return absl::InternalError(absl::StrCat(path, ": ", rule.status().message()));
    return rule;
  }
  return Invalid(path, absl::StrCat("format '", format,
                                    "' is not supported (date, time, date-time, uuid, email, uri, "
                                    "ipv4, ipv6, hostname, duration are)"));
}

absl::StatusOr<int32_t> SchemaCompiler::RegexString(const std::string& regex, RegexMatch match) {
  RegexOptions options;
  options.text = RegexText::kJsonString;
  options.match = match;
  ASSIGN_OR_RETURN(const int32_t body, AddRegex(regex, options, b_));
  return b_.AddRule("regex_string",
                    {{B::Bytes(ByteSet::Of("\"")), B::Ref(body), B::Bytes(ByteSet::Of("\""))}});
}

absl::StatusOr<int32_t> SchemaCompiler::Pattern(const Json& s, const std::string& path) {
  if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
    return Invalid(path, "pattern together with minLength, maxLength or format is not supported");
  }
  if (!s["pattern"].is_string()) return Invalid(path, "pattern must be a string");
  absl::StatusOr<int32_t> rule = RegexString(s["pattern"].get<std::string>(), RegexMatch::kSearch);
  if (!rule.ok()) return Invalid(path, absl::StrCat("pattern: ", rule.status().message()));
  return rule;
}

}  // namespace

absl::StatusOr<int32_t> AddJsonSchema(const nlohmann::ordered_json& schema,
                                      const JsonSchemaOptions& options, GrammarBuilder& b,
                                      JsonRules& json) {
  return SchemaCompiler(schema, options, b, json).Run();
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  GrammarBuilder b(options.max_symbols);
  JsonRules json(b, options.max_whitespace);
  ASSIGN_OR_RETURN(const int32_t root, AddJsonSchema(schema, options, b, json));
  ASSIGN_OR_RETURN(Grammar g, b.Build(root));
  return std::make_shared<const Grammar>(std::move(g));
}

absl::StatusOr<std::shared_ptr<const Grammar>> AnyJsonObject(const JsonSchemaOptions& options) {
  GrammarBuilder b(options.max_symbols);
  JsonRules json(b, options.max_whitespace);
  ASSIGN_OR_RETURN(Grammar g, b.Build(json.AnyObject()));
  return std::make_shared<const Grammar>(std::move(g));
}

}  // namespace specula::grammar
