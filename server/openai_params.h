// Reading OpenAI request parameters out of a JSON body, shared by the chat/completions parser
// (server/openai_request.h) and the Responses API's (server/responses_request.h): type and range
// checks whose refusals are OpenAI errors naming the parameter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "server/request_json.h"
#include "specula/v1/specula.pb.h"

namespace specula {

// An error in OpenAI's format: {"error": {"message", "type", "param", "code"}} with its status.
struct OpenAiError {
  int http_status = 400;
  std::string type;  // invalid_request_error, not_found_error, ...
  std::string message;
  std::string param;  // the offending field, or ""
  std::string code;   // e.g. "model_not_found", or ""
};

// Each reader returns the refusal, or nullopt when the parameter is absent, null or valid.
using ParamError = std::optional<OpenAiError>;

// The body parsed as a JSON object whose keys are all `known` and whose "model" is
// `served_model` (404 model_not_found otherwise).
ParamError ReadBody(const std::string& text, const absl::flat_hash_set<std::string>& known,
                    const std::string& served_model, OrderedJson* body, std::string* model);

OpenAiError BadParam(std::string param, std::string message);
// "'param' must be <expected>, got <the JSON type of v>".
OpenAiError WrongType(const std::string& param, const OrderedJson& v, const char* expected);
// Whether `body` has `key` with a value other than null (an absent parameter).
bool Present(const OrderedJson& body, const std::string& key);
// Whether object `o` has `key` and it is the string `value`. (json::value(key, default) throws
// when the key holds another type, which on a worker thread would end the process.)
bool IsString(const OrderedJson& o, const char* key, const char* value);

ParamError ReadNumber(const OrderedJson& body, const std::string& key, double lo, double hi,
                      std::optional<double>* out);
ParamError ReadInt(const OrderedJson& body, const std::string& key, int64_t lo, int64_t hi,
                   std::optional<int64_t>* out);
ParamError ReadBool(const OrderedJson& body, const std::string& key, bool* out);
// A string member, or nullopt when absent or null.
ParamError ReadString(const OrderedJson& body, const std::string& key,
                      std::optional<std::string>* out);

// temperature, top_p, frequency/presence/repetition penalties, min_p, top_k and seed, with
// OpenAI's (and vLLM's, for the extensions) ranges.
ParamError ReadSampling(const OrderedJson& body, v1::SamplingParams* s);

// A json_schema output format's members {name, schema, strict} (chat's
// response_format.json_schema, the Responses API's text.format), as the request's constraint.
// `param` names the object holding them. The schema is compiled with the rest of the request
// (ToEngineRequest), which names what it does not support.
ParamError ReadJsonSchemaFormat(const OrderedJson& spec, const std::string& param,
                                v1::GenerateRequest* out);

// Parameters that change nothing on a self-hosted model, accepted when well-typed and otherwise
// ignored. Each entry of `keys` is checked to have its type when present and not null.
struct IgnoredParam {
  const char* key;
  bool (OrderedJson::*has_type)() const noexcept;
  const char* expected;  // "a string", ...
};
ParamError CheckIgnored(const OrderedJson& body, const IgnoredParam* begin,
                        const IgnoredParam* end);

// A tool call's arguments as the chat template wants them (an object): OpenAI sends them as JSON
// text, which is decoded; anything but an object is refused, naming `param`.
ParamError ReadToolArguments(const OrderedJson& arguments, const std::string& param,
                             OrderedJson* out);

// reasoning_effort's values: none, minimal, low, medium, high.
ParamError ReadReasoningEffort(const OrderedJson& v, const std::string& param,
                               std::optional<std::string>* out);

}  // namespace specula
