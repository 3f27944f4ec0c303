#include "server/openai_params.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "server/chat.h"

namespace specula {
namespace {

const char* JsonTypeName(const OrderedJson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

}  // namespace

bool Present(const OrderedJson& body, const std::string& key) {
  return body.contains(key) && !body[key].is_null();
}

OpenAiError BadParam(std::string param, std::string message) {
  return {400, "invalid_request_error", std::move(message), std::move(param), ""};
}

OpenAiError WrongType(const std::string& param, const OrderedJson& v, const char* expected) {
  return BadParam(param,
                  absl::StrCat("'", param, "' must be ", expected, ", got ", JsonTypeName(v)));
}

ParamError ReadBody(const std::string& text, const absl::flat_hash_set<std::string>& known,
                    const std::string& served_model, OrderedJson* body, std::string* model) {
  absl::StatusOr<OrderedJson> parsed = ParseRequestJson(text, "the request body");
  if (!parsed.ok()) return BadParam("", std::string(parsed.status().message()));
  *body = *std::move(parsed);
  if (!body->is_object()) return BadParam("", "the request body must be a JSON object");
  for (const auto& [key, value] : body->items()) {
    if (!known.contains(key)) {
      return BadParam(key, absl::StrCat("unsupported parameter '", key, "'"));
    }
  }
  if (!body->contains("model") || !(*body)["model"].is_string()) {
    return BadParam("model", "'model' is required (a string)");
  }
  *model = (*body)["model"].get<std::string>();
  if (*model != served_model) {
    return OpenAiError{404, "not_found_error",
                       absl::StrCat("the model '", *model, "' does not exist; this server serves '",
                                    served_model, "'"),
                       "model", "model_not_found"};
  }
  return std::nullopt;
}

bool IsString(const OrderedJson& o, const char* key, const char* value) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() && it->get_ref<const std::string&>() == value;
}

ParamError ReadNumber(const OrderedJson& body, const std::string& key, double lo, double hi,
                      std::optional<double>* out) {
  if (!Present(body, key)) return std::nullopt;
  const OrderedJson& v = body[key];
  if (!v.is_number()) return WrongType(key, v, "a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    return BadParam(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", x));
  }
  *out = x;
  return std::nullopt;
}

ParamError ReadInt(const OrderedJson& body, const std::string& key, int64_t lo, int64_t hi,
                   std::optional<int64_t>* out) {
  if (!Present(body, key)) return std::nullopt;
  const OrderedJson& v = body[key];
  if (!v.is_number_integer()) return WrongType(key, v, "an integer");
  const bool above = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t x = above ? hi : v.get<int64_t>();
  if (above || x < lo || x > hi) {
    return BadParam(key,
                    absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", v.dump()));
  }
  *out = x;
  return std::nullopt;
}

ParamError ReadBool(const OrderedJson& body, const std::string& key, bool* out) {
  if (!Present(body, key)) return std::nullopt;
  if (!body[key].is_boolean()) return WrongType(key, body[key], "a boolean");
  *out = body[key].get<bool>();
  return std::nullopt;
}

ParamError ReadString(const OrderedJson& body, const std::string& key,
                      std::optional<std::string>* out) {
  if (!Present(body, key)) return std::nullopt;
  if (!body[key].is_string()) return WrongType(key, body[key], "a string");
  *out = body[key].get<std::string>();
  return std::nullopt;
}

ParamError ReadSampling(const OrderedJson& body, v1::SamplingParams* s) {
  std::optional<double> x;
  ParamError e;
  if ((e = ReadNumber(body, "temperature", 0, 2, &x))) return e;
  if (x) s->set_temperature(static_cast<float>(*x));
  x.reset();
  if ((e = ReadNumber(body, "top_p", 0, 1, &x))) return e;
  if (x) {
    if (*x == 0) return BadParam("top_p", "'top_p' must be in (0, 1], got 0");
    s->set_top_p(static_cast<float>(*x));
  }
  x.reset();
  if ((e = ReadNumber(body, "frequency_penalty", -2, 2, &x))) return e;
  if (x) s->set_frequency_penalty(static_cast<float>(*x));
  x.reset();
  if ((e = ReadNumber(body, "presence_penalty", -2, 2, &x))) return e;
  if (x) s->set_presence_penalty(static_cast<float>(*x));
  x.reset();
  if ((e = ReadNumber(body, "min_p", 0, 1, &x))) return e;
  if (x) s->set_min_p(static_cast<float>(*x));
  x.reset();
  if ((e = ReadNumber(body, "repetition_penalty", 1e-6, 1e6, &x))) return e;
  if (x) s->set_repetition_penalty(static_cast<float>(*x));
  std::optional<int64_t> i;
  if ((e = ReadInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &i))) return e;
  if (i) s->set_top_k(static_cast<int32_t>(std::max<int64_t>(*i, 0)));  // vLLM: -1 = off
  i.reset();
  if ((e = ReadInt(body, "seed", std::numeric_limits<int64_t>::min(),
                   std::numeric_limits<int64_t>::max(), &i))) {
    return e;
  }
  if (i) s->set_seed(static_cast<uint64_t>(*i));
  return std::nullopt;
}

ParamError ReadJsonSchemaFormat(const OrderedJson& spec, const std::string& param,
                                v1::GenerateRequest* out) {
  if (!spec.contains("name") || !spec["name"].is_string()) {
    return BadParam(param + ".name", absl::StrCat("'", param, ".name' is required (a string)"));
  }
  const auto schema = spec.find("schema");
  if (schema == spec.end() || !(schema->is_object() || schema->is_boolean())) {
    return BadParam(param + ".schema",
                    absl::StrCat("'", param, ".schema' must be a JSON Schema object"));
  }
  bool strict = false;
  if (ParamError e = ReadBool(spec, "strict", &strict)) {
    e->param = param + ".strict";
    return e;
  }
  out->mutable_output_constraint()->set_json_schema(schema->dump());
  out->mutable_output_constraint()->set_strict(strict);
  return std::nullopt;
}

ParamError CheckIgnored(const OrderedJson& body, const IgnoredParam* begin,
                        const IgnoredParam* end) {
  for (const IgnoredParam* i = begin; i != end; ++i) {
    if (Present(body, i->key) && !(body[i->key].*i->has_type)()) {
      return WrongType(i->key, body[i->key], i->expected);
    }
  }
  return std::nullopt;
}

ParamError ReadToolArguments(const OrderedJson& arguments, const std::string& param,
                             OrderedJson* out) {
  *out = arguments;
  if (arguments.is_string()) {
    absl::StatusOr<OrderedJson> decoded = ParseRequestJson(arguments.get<std::string>(), param);
    if (!decoded.ok()) return BadParam(param, std::string(decoded.status().message()));
    *out = *std::move(decoded);
  }
  if (!out->is_object()) return BadParam(param, "tool call arguments must be a JSON object");
  return std::nullopt;
}

ParamError ReadReasoningEffort(const OrderedJson& v, const std::string& param,
                               std::optional<std::string>* out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) return WrongType(param, v, "a string");
  if (absl::Status s = CheckReasoningEffort(v.get<std::string>()); !s.ok()) {
    return BadParam(param, std::string(s.message()));
  }
  *out = v.get<std::string>();
  return std::nullopt;
}

}  // namespace specula
