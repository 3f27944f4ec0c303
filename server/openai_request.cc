#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/template/chat_template.h"
#include "engine/common/capacity_error.h"
#include "engine/common/session_busy.h"
#include "server/compiled_constraints.h"
#include "server/request_json.h"

namespace specula {
namespace {

using Error = ParamError;

// The parameters each endpoint takes; anything else is refused by name.
const absl::flat_hash_set<std::string>& KnownKeys(OpenAiEndpoint endpoint) {
  static const absl::flat_hash_set<std::string> kCommon = {
      "model", "max_tokens", "stop", "seed", "temperature", "top_p", "frequency_penalty",
      "presence_penalty", "stream", "stream_options", "n", "logprobs", "logit_bias",
      // Sent by OpenAI clients and agent frameworks, with no effect here (CheckIgnored).
      "user", "store", "metadata", "service_tier", "prompt_cache_key",
      // vLLM-style extensions.
      "top_k", "min_p", "repetition_penalty", "ignore_eos", "structured_outputs"};
  static const absl::flat_hash_set<std::string> kChat = [] {
    absl::flat_hash_set<std::string> keys = kCommon;
    keys.insert({"messages", "tools", "tool_choice", "max_completion_tokens", "top_logprobs",
                 "response_format", "parallel_tool_calls", "chat_template_kwargs",
                 "reasoning_effort", "control_tokens_in_content"});
    return keys;
  }();
  static const absl::flat_hash_set<std::string> kCompletions = [] {
    absl::flat_hash_set<std::string> keys = kCommon;
    keys.insert({"prompt", "echo", "best_of", "suffix"});
    return keys;
  }();
  return endpoint == OpenAiEndpoint::kChatCompletions ? kChat : kCompletions;
}

// An integer parameter accepted only at 1: a value of the wrong type is a type error, as for
// every other parameter; another integer says what is supported.
Error CheckOnlyOne(const OrderedJson& body, const std::string& key) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const OrderedJson& v = body[key];
  if (!v.is_number_integer()) return WrongType(key, v, "an integer");
  if (!(v.is_number_unsigned() ? v.get<uint64_t>() == 1 : v.get<int64_t>() == 1)) {
    return BadParam(key, absl::StrCat("only ", key, " = 1 is supported"));
  }
  return std::nullopt;
}

// Parameters that change nothing on a self-hosted model, accepted when well-typed and otherwise
// ignored: `store` (nothing is kept: there is no retrieval API for chat completions), `metadata`
// (goes with store), `service_tier` (one tier), `prompt_cache_key` (the prefix cache finds
// shared prefixes without a key), `user` (an end-user id for abuse tracking).
constexpr IgnoredParam kIgnored[] = {{"store", &OrderedJson::is_boolean, "a boolean"},
                                     {"metadata", &OrderedJson::is_object, "an object"},
                                     {"service_tier", &OrderedJson::is_string, "a string"},
                                     {"prompt_cache_key", &OrderedJson::is_string, "a string"},
                                     {"user", &OrderedJson::is_string, "a string"}};

// Parameters accepted only at their neutral value (so a client relying on them hears about it).
Error CheckNeutral(const OrderedJson& body) {
  if (Error e = CheckOnlyOne(body, "n")) return e;
  if (Error e = CheckOnlyOne(body, "best_of")) return e;
  if (Present(body, "echo") && body["echo"] != false) {
    return BadParam("echo", "echo is not supported");
  }
  if (Present(body, "suffix")) {
    return BadParam("suffix", "suffix is not supported");
  }
  if (Present(body, "logit_bias") &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty())) {
    return BadParam("logit_bias", "logit_bias is not supported");
  }
  return std::nullopt;
}

// response_format: text (unconstrained), json_object, or json_schema {name, schema, strict}, as
// the request's output constraint.
Error ReadResponseFormat(const OrderedJson& body, v1::GenerateRequest* out) {
  if (!Present(body, "response_format")) return std::nullopt;
  const OrderedJson& f = body["response_format"];
  if (!f.is_object()) return WrongType("response_format", f, "an object");
  if (IsString(f, "type", "text")) return std::nullopt;
  if (IsString(f, "type", "json_object")) {
    out->mutable_output_constraint()->set_json_object(true);
    return std::nullopt;
  }
  if (!IsString(f, "type", "json_schema")) {
    return BadParam("response_format.type",
                    "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  }
  const auto spec = f.find("json_schema");
  if (spec == f.end() || !spec->is_object()) {
    return BadParam("response_format.json_schema",
                    "'response_format.json_schema' must be an object {\"name\", \"schema\", "
                    "\"strict\"}");
  }
  return ReadJsonSchemaFormat(*spec, "response_format.json_schema", out);
}

// vLLM's structured_outputs: exactly one of regex (the whole output matches it), choice (exactly
// one of the strings), grammar (EBNF, GBNF dialect), json (a JSON Schema) or json_object (true).
Error ReadStructuredOutputs(const OrderedJson& body, v1::GenerateRequest* out) {
  if (!Present(body, "structured_outputs")) return std::nullopt;
  const OrderedJson& so = body["structured_outputs"];
  if (!so.is_object()) return WrongType("structured_outputs", so, "an object");
  if (out->has_output_constraint()) {
    return BadParam("structured_outputs", "give response_format or structured_outputs, not both");
  }
  std::vector<std::string> given;
  for (const auto& [key, value] : so.items()) {
    if (!value.is_null()) given.push_back(key);
  }
  if (given.size() != 1) {
    return BadParam("structured_outputs",
                    "'structured_outputs' takes exactly one of regex, choice, grammar, json, "
                    "json_object");
  }
  const std::string& kind = given[0];
  const OrderedJson& v = so[kind];
  const std::string param = "structured_outputs." + kind;
  v1::OutputConstraint* c = out->mutable_output_constraint();
  if (kind == "regex" || kind == "grammar") {
    if (!v.is_string()) return WrongType(param, v, "a string");
    if (kind == "regex") {
      c->set_regex(v.get<std::string>());
    } else {
      c->set_grammar(v.get<std::string>());
    }
  } else if (kind == "choice") {
    if (!v.is_array() || v.empty()) return WrongType(param, v, "a non-empty array of strings");
    for (const OrderedJson& o : v) {
      if (!o.is_string()) return BadParam(param, "'" + param + "' must hold strings only");
      c->mutable_choice()->add_options(o.get<std::string>());
    }
  } else if (kind == "json") {
    // Its text goes through the request's own JSON reader, with its nesting limit.
    absl::StatusOr<OrderedJson> parsed = v.is_string()
                                             ? ParseRequestJson(v.get<std::string>(), param)
                                             : absl::StatusOr<OrderedJson>(v);
    if (!parsed.ok()) return BadParam(param, std::string(parsed.status().message()));
    if (!(parsed->is_object() || parsed->is_boolean())) {
      return BadParam(param, "'" + param + "' must be a JSON Schema (an object, or its text)");
    }
    c->set_json_schema(parsed->dump());
  } else if (kind == "json_object") {
    if (v != true) return BadParam(param, "'" + param + "' must be true");
    c->set_json_object(true);
  } else {
    return BadParam(param, absl::StrCat("'", param,
                                        "' is not supported (regex, choice, grammar, "
                                        "json and json_object are)"));
  }
  return std::nullopt;
}

// An empty stop string is refused, as over gRPC (the engine's rule): it would match before any
// output, so no answer could honour it.
Error ReadStop(const OrderedJson& body, v1::StoppingCriteria* stop) {
  if (!Present(body, "stop")) return std::nullopt;
  const OrderedJson& v = body["stop"];
  auto add = [stop](const OrderedJson& s) -> Error {
    if (!s.is_string()) return BadParam("stop", "'stop' must hold strings only");
    if (s.get_ref<const std::string&>().empty()) {
      return BadParam("stop", "'stop' strings must not be empty");
    }
    stop->add_stop(s.get<std::string>());
    return std::nullopt;
  };
  if (v.is_string()) return add(v);
  if (!v.is_array()) return WrongType("stop", v, "a string or an array of strings");
  for (const OrderedJson& s : v) {
    if (Error e = add(s)) return e;
  }
  return std::nullopt;
}

Error ReadLength(const OrderedJson& body, OpenAiEndpoint endpoint, v1::StoppingCriteria* stop) {
  std::optional<int64_t> n;
  const char* key = "max_tokens";
  Error e;
  if ((e = ReadInt(body, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &n))) return e;
  if (endpoint == OpenAiEndpoint::kChatCompletions && body.contains("max_completion_tokens") &&
      !body["max_completion_tokens"].is_null()) {
    if (n) {
      return BadParam("max_completion_tokens", "set max_tokens or max_completion_tokens, not both");
    }
    key = "max_completion_tokens";
    if ((e = ReadInt(body, key, 1, std::numeric_limits<int32_t>::max(), &n))) return e;
  }
  // Unset: the server's one rule for requests that name no length (ToEngineRequest), not
  // OpenAI's 16 for completions, which would refuse long prompts for a length nobody chose.
  if (n) stop->set_max_tokens(static_cast<int32_t>(*n));
  bool ignore_eos = false;
  if ((e = ReadBool(body, "ignore_eos", &ignore_eos))) return e;
  stop->set_ignore_eos(ignore_eos);
  return ReadStop(body, stop);
}

// Chat message content: a string, null, or an array of text parts (joined). Null (an assistant
// message that only calls tools) reaches the template as "", as in vLLM: Qwen3's template, for
// one, tests `'</think>' in content`, which fails on None.
Error ReadContent(const OrderedJson& v, const std::string& param, OrderedJson* out) {
  if (v.is_null() || v.is_string()) {
    *out = v.is_null() ? OrderedJson("") : v;
    return std::nullopt;
  }
  if (!v.is_array()) return WrongType(param, v, "a string, null or an array of text parts");
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const OrderedJson& part = v[i];
    const std::string p = absl::StrCat(param, "[", i, "]");
    if (!part.is_object() || !IsString(part, "type", "text") || !part.contains("text") ||
        !part["text"].is_string()) {
      return BadParam(p, absl::StrCat("'", p,
                                      "': only {\"type\": \"text\", \"text\": ...} parts "
                                      "are supported"));
    }
    text += part["text"].get<std::string>();
  }
  *out = text;
  return std::nullopt;
}

Error ReadToolCalls(const OrderedJson& v, const std::string& param, OrderedJson* out) {
  if (!v.is_array()) return WrongType(param, v, "an array");
  *out = OrderedJson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = absl::StrCat(param, "[", i, "]");
    const OrderedJson& call = v[i];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string()) {
      return BadParam(p, absl::StrCat("'", p,
                                      "' must be {\"id\", \"type\": \"function\", "
                                      "\"function\": {\"name\", \"arguments\"}}"));
    }
    OrderedJson arguments;
    if (Error e = ReadToolArguments(call["function"].value("arguments", OrderedJson::object()),
                                    p + ".function.arguments", &arguments)) {
      return e;
    }
    OrderedJson converted = OrderedJson::object();
    if (call.contains("id") && call["id"].is_string()) converted["id"] = call["id"];
    converted["type"] = "function";
    converted["function"] = {{"name", call["function"]["name"]}, {"arguments", arguments}};
    out->push_back(std::move(converted));
  }
  return std::nullopt;
}

Error ReadMessage(const OrderedJson& m, size_t index, OrderedJson* out) {
  const std::string p = absl::StrCat("messages[", index, "]");
  if (!m.is_object()) return WrongType(p, m, "an object");
  if (!m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty()) {
    return BadParam(p + ".role", absl::StrCat("'", p, ".role' must be a non-empty string"));
  }
  *out = OrderedJson::object();
  (*out)["role"] = m["role"];
  OrderedJson content;
  if (Error e = ReadContent(m.value("content", OrderedJson()), p + ".content", &content)) return e;
  (*out)["content"] = std::move(content);
  for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
    if (!m.contains(key) || m[key].is_null()) continue;
    if (!m[key].is_string()) return WrongType(absl::StrCat(p, ".", key), m[key], "a string");
    (*out)[key] = m[key];
  }
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    OrderedJson calls;
    if (Error e = ReadToolCalls(m["tool_calls"], p + ".tool_calls", &calls)) return e;
    if (!calls.empty()) (*out)["tool_calls"] = std::move(calls);
  }
  return std::nullopt;
}

// Function tools in the chat form; the names of the strict ones go to chat->strict_tools.
Error ReadTools(const OrderedJson& body, ChatRequest* chat) {
  OrderedJson* out = &chat->tools;
  if (!Present(body, "tools")) return std::nullopt;
  const OrderedJson& v = body["tools"];
  if (!v.is_array()) return WrongType("tools", v, "an array");
  if (v.empty()) return std::nullopt;
  *out = OrderedJson::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = absl::StrCat("tools[", i, "]");
    const OrderedJson& t = v[i];
    if (!t.is_object() || !IsString(t, "type", "function") || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      return BadParam(p, absl::StrCat("'", p,
                                      "' must be {\"type\": \"function\", \"function\": "
                                      "{\"name\", \"description\", \"parameters\"}}"));
    }
    OrderedJson function = t["function"];
    const std::string name_field = p + ".function.name";
    if (absl::Status s = CheckToolName(function["name"].get<std::string>(), name_field); !s.ok()) {
      return BadParam(name_field, std::string(s.message()));
    }
    if (function.contains("strict") && !function["strict"].is_null() &&
        !function["strict"].is_boolean()) {
      return WrongType(p + ".function.strict", function["strict"], "a boolean");
    }
    if (function.contains("strict") && function["strict"] == true) {
      chat->strict_tools.insert(function["name"].get<std::string>());
    }
    function.erase("strict");  // the template sees the tool as without strict
    out->push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return std::nullopt;
}

Error ReadToolChoice(const OrderedJson& body, const OrderedJson& tools, ToolChoice* out) {
  if (!Present(body, "tool_choice")) return std::nullopt;
  const OrderedJson& v = body["tool_choice"];
  std::string name;
  if (v.is_string()) {
    name = v.get<std::string>();
    if (name != "auto" && name != "none" && name != "required") {
      return BadParam("tool_choice",
                      "'tool_choice' must be auto, none, required or "
                      "{\"type\": \"function\", \"function\": {\"name\"}}");
    }
  } else if (v.is_object() && v.contains("function") && v["function"].is_object() &&
             v["function"].contains("name") && v["function"]["name"].is_string()) {
    name = v["function"]["name"].get<std::string>();
  } else {
    return WrongType("tool_choice", v, "a string or {\"type\": \"function\", ...}");
  }
  absl::StatusOr<ToolChoice> choice = ParseToolChoice(name, tools, "tool_choice");
  if (!choice.ok()) return BadParam("tool_choice", std::string(choice.status().message()));
  *out = *std::move(choice);
  return std::nullopt;
}

// reasoning_effort: mapped onto the template's thinking switch by ChatModel::Render.
Error ReadChatReasoningEffort(const OrderedJson& body, ChatRequest* chat) {
  if (!body.contains("reasoning_effort")) return std::nullopt;
  return ReadReasoningEffort(body["reasoning_effort"], "reasoning_effort", &chat->reasoning_effort);
}

Error ReadChat(const OrderedJson& body, ChatRequest* chat) {
  if (!body.contains("messages")) return BadParam("messages", "'messages' is required");
  const OrderedJson& messages = body["messages"];
  if (!messages.is_array()) return WrongType("messages", messages, "an array");
  if (messages.empty()) return BadParam("messages", "'messages' is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    OrderedJson m;
    if (Error e = ReadMessage(messages[i], i, &m)) return e;
    chat->messages.push_back(std::move(m));
  }
  if (Error e = ReadTools(body, chat)) return e;
  if (Error e = ReadToolChoice(body, chat->tools, &chat->tool_choice)) return e;
  if (Error e = ReadBool(body, "parallel_tool_calls", &chat->parallel_tool_calls)) return e;
  if (Error e = ReadChatReasoningEffort(body, chat)) return e;
  if (Error e = ReadBool(body, "control_tokens_in_content", &chat->control_tokens_in_content)) {
    return e;
  }
  if (Present(body, "chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object()) {
      return WrongType("chat_template_kwargs", body["chat_template_kwargs"], "an object");
    }
    for (const auto& [key, value] : body["chat_template_kwargs"].items()) {
      if (absl::Status s = CheckChatTemplateKwarg(key); !s.ok()) {
        return OpenAiErrorFrom(s, absl::StrCat("chat_template_kwargs.", key));
      }
    }
    chat->kwargs = body["chat_template_kwargs"];
  }
  return std::nullopt;
}

// Completions: a string, a one-string array, or token ids (one array, or an array of one).
Error ReadPrompt(const OrderedJson& body, v1::GenerateRequest* g) {
  if (!body.contains("prompt")) return BadParam("prompt", "'prompt' is required");
  OrderedJson v = body["prompt"];
  if (v.is_array() && v.size() == 1 && (v[0].is_string() || v[0].is_array())) v = v[0];
  if (v.is_string()) {
    g->set_prompt(v.get<std::string>());
    return std::nullopt;
  }
  if (!v.is_array() || v.empty()) {
    return BadParam("prompt", "'prompt' must be a string or an array of token ids (one prompt)");
  }
  for (const OrderedJson& id : v) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return BadParam("prompt", "'prompt' must be a string or an array of token ids (one prompt)");
    }
    g->mutable_prompt_token_ids()->add_ids(id.get<uint32_t>());
  }
  return std::nullopt;
}

Error ReadStreamAndLogprobs(const OrderedJson& body, OpenAiEndpoint endpoint, OpenAiRequest* out) {
  if (Error e = ReadBool(body, "stream", &out->stream)) return e;
  if (Present(body, "stream_options")) {
    const OrderedJson& so = body["stream_options"];
    if (!so.is_object()) return WrongType("stream_options", so, "an object");
    // Without stream it has nothing to act on (clients send it by default): checked, unused.
    for (const auto& [key, value] : so.items()) {
      if (key != "include_usage") {
        return BadParam("stream_options." + key,
                        absl::StrCat("unsupported parameter 'stream_options.", key, "'"));
      }
    }
    if (Error e = ReadBool(so, "include_usage", &out->include_usage)) return e;
  }
  std::optional<int64_t> n;
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    if (Error e = ReadBool(body, "logprobs", &out->logprobs)) return e;
    if (Error e = ReadInt(body, "top_logprobs", 0, 20, &n)) return e;
    if (n && !out->logprobs) return BadParam("top_logprobs", "'top_logprobs' needs logprobs: true");
  } else {
    if (Error e = ReadInt(body, "logprobs", 0, 5, &n)) return e;
    out->logprobs = n.has_value();
  }
  out->top_logprobs = static_cast<int>(n.value_or(0));
  if (out->logprobs) out->generate.mutable_sampling()->set_logprobs(out->top_logprobs);
  return std::nullopt;
}

}  // namespace

OpenAiError OpenAiErrorFrom(const absl::Status& status, std::string param) {
  OpenAiError e;
  e.message = std::string(status.message());
  e.param = std::move(param);
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
      // A session whose last turn still runs: a conflict the client can wait out.
      e.http_status = IsSessionBusy(status) ? 409 : 400;
      e.type = IsSessionBusy(status) ? "conflict_error" : "invalid_request_error";
      break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      // Larger than the server can ever hold is the client's to fix, like a prompt past the
      // context: 400, which OpenAI clients do not retry; full-for-now is 429.
      e.http_status = IsNeverFits(status) ? 400 : 429;
      e.type = IsNeverFits(status) ? "invalid_request_error" : "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
      break;
  }
  return e;
}

std::string OpenAiErrorJson(const OpenAiError& error) {
  OrderedJson body = {{"error",
                       {{"message", error.message},
                        {"type", error.type},
                        {"param", error.param.empty() ? OrderedJson() : OrderedJson(error.param)},
                        {"code", error.code.empty() ? OrderedJson() : OrderedJson(error.code)}}}};
  return body.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

HttpResponse JsonResponse(int status, const OrderedJson& body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return r;
}

HttpResponse OpenAiErrorResponse(const OpenAiError& error) {
  HttpResponse r;
  r.status = error.http_status;
  r.content_type = "application/json";
  r.body = OpenAiErrorJson(error);
  return r;
}

std::optional<OpenAiError> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body_text,
                                              const std::string& served_model, OpenAiRequest* out) {
  OrderedJson body;
  out->endpoint = endpoint;
  if (Error e = ReadBody(body_text, KnownKeys(endpoint), served_model, &body, &out->model)) {
    return e;
  }
  if (Error e = CheckIgnored(body, std::begin(kIgnored), std::end(kIgnored))) return e;
  if (Error e = CheckNeutral(body)) return e;
  if (Error e = ReadSampling(body, out->generate.mutable_sampling())) return e;
  if (Error e = ReadLength(body, endpoint, out->generate.mutable_stopping())) {
    return e;
  }
  if (Error e = ReadStreamAndLogprobs(body, endpoint, out)) return e;
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    if (Error e = ReadResponseFormat(body, &out->generate)) return e;
  }
  if (Error e = ReadStructuredOutputs(body, &out->generate)) return e;
  if (endpoint == OpenAiEndpoint::kCompletions) return ReadPrompt(body, &out->generate);
  out->chat.emplace();
  if (Error e = ReadChat(body, &*out->chat)) return e;
  // The constraint holds from the first token, so a tool call could never be written.
  if (ToolsShown(*out->chat) && Constrains(out->generate.output_constraint())) {
    const bool format = Present(body, "response_format");
    return BadParam(
        format ? "response_format" : "structured_outputs",
        absl::StrCat(format ? "response_format json_object or json_schema" : "structured_outputs",
                     " together with tools is not supported yet (the model could not "
                     "call them); use tool_choice \"none\" or leave one out"));
  }
  return std::nullopt;
}

}  // namespace specula
