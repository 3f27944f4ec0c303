#include "server/responses_request.h"

#include <sys/random.h>

#include <algorithm>
#include <iterator>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/compiled_constraints.h"

namespace specula {
namespace {

const absl::flat_hash_set<std::string>& KnownKeys() {
  static const absl::flat_hash_set<std::string> kKeys = {
      "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options",
      "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature", "top_p",
      "text", "reasoning", "truncation", "include", "background",
      // Accepted and ignored (CheckIgnored).
      "metadata", "user", "service_tier", "prompt_cache_key", "safety_identifier",
      // Extensions, as on chat completions.
      "top_k", "min_p", "repetition_penalty", "seed", "control_tokens_in_content"};
  return kKeys;
}

constexpr IgnoredParam kIgnored[] = {{"metadata", &OrderedJson::is_object, "an object"},
                                     {"user", &OrderedJson::is_string, "a string"},
                                     {"service_tier", &OrderedJson::is_string, "a string"},
                                     {"prompt_cache_key", &OrderedJson::is_string, "a string"},
                                     {"safety_identifier", &OrderedJson::is_string, "a string"}};

// Text content: a string, or an array of text parts (input_text, output_text, text; an
// assistant's refusal counts as its text), joined. Images, files and audio are refused.
ParamError ReadText(const OrderedJson& v, const std::string& param, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return WrongType(param, v, "a string or an array of text parts");
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const OrderedJson& part = v[i];
    const std::string p = absl::StrCat(param, "[", i, "]");
    const bool text = IsString(part, "type", "input_text") ||
                      IsString(part, "type", "output_text") || IsString(part, "type", "text");
    if (text && part.contains("text") && part["text"].is_string()) {
      *out += part["text"].get<std::string>();
    } else if (IsString(part, "type", "refusal") && part.contains("refusal") &&
               part["refusal"].is_string()) {
      *out += part["refusal"].get<std::string>();
    } else {
      return BadParam(p, absl::StrCat("'", p,
                                      "': only text parts are supported ({\"type\": "
                                      "\"input_text\" or \"output_text\", \"text\"})"));
    }
  }
  return std::nullopt;
}

ParamError RequiredString(const OrderedJson& item, const char* key, const std::string& param,
                          std::string* out) {
  if (!item.contains(key) || !item[key].is_string()) {
    return BadParam(absl::StrCat(param, ".", key),
                    absl::StrCat("'", param, ".", key, "' is required (a string)"));
  }
  *out = item[key].get<std::string>();
  return std::nullopt;
}

ParamError ReadMessageItem(const OrderedJson& item, const std::string& p, OrderedJson* out) {
  std::string role;
  if (ParamError e = RequiredString(item, "role", p, &role)) return e;
  if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
    return BadParam(p + ".role",
                    absl::StrCat("'", p, ".role' must be user, system, developer or assistant"));
  }
  std::string content;
  if (!item.contains("content")) {
    return BadParam(p + ".content", absl::StrCat("'", p, ".content' is required"));
  }
  if (ParamError e = ReadText(item["content"], p + ".content", &content)) return e;
  // The chat templates know system, not OpenAI's newer name for it.
  *out = {{"role", role == "developer" ? "system" : role}, {"content", std::move(content)}};
  return std::nullopt;
}

ParamError ReadFunctionCallItem(const OrderedJson& item, const std::string& p, OrderedJson* out) {
  std::string call_id, name;
  if (ParamError e = RequiredString(item, "call_id", p, &call_id)) return e;
  if (ParamError e = RequiredString(item, "name", p, &name)) return e;
  if (!item.contains("arguments")) {
    return BadParam(p + ".arguments", absl::StrCat("'", p, ".arguments' is required"));
  }
  OrderedJson arguments;
  if (ParamError e = ReadToolArguments(item["arguments"], p + ".arguments", &arguments)) return e;
  OrderedJson call = {{"id", call_id},
                      {"type", "function"},
                      {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
  *out = {{"role", "assistant"}, {"content", ""}, {"tool_calls", OrderedJson::array({call})}};
  return std::nullopt;
}

ParamError ReadFunctionOutputItem(const OrderedJson& item, const std::string& p, OrderedJson* out) {
  std::string call_id, output;
  if (ParamError e = RequiredString(item, "call_id", p, &call_id)) return e;
  if (!item.contains("output")) {
    return BadParam(p + ".output", absl::StrCat("'", p, ".output' is required"));
  }
  if (ParamError e = ReadText(item["output"], p + ".output", &output)) return e;
  *out = {{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(output)}};
  return std::nullopt;
}

// A reasoning item's text: its content (reasoning_text parts), else its summary.
ParamError ReadReasoningItem(const OrderedJson& item, const std::string& p, OrderedJson* out) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    if (!Present(item, key)) continue;
    const OrderedJson& parts = item[key];
    if (!parts.is_array()) return WrongType(absl::StrCat(p, ".", key), parts, "an array");
    for (const OrderedJson& part : parts) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) {
        text += part["text"].get<std::string>();
      }
    }
    if (!text.empty()) break;
  }
  *out = {{"role", "assistant"}, {"content", ""}, {"reasoning_content", std::move(text)}};
  return std::nullopt;
}

ParamError ReadItem(const OrderedJson& item, size_t index, OrderedJson* out) {
  const std::string p = absl::StrCat("input[", index, "]");
  if (!item.is_object()) return WrongType(p, item, "an object");
  std::string type = "message";
  if (Present(item, "type")) {
    if (!item["type"].is_string()) return WrongType(p + ".type", item["type"], "a string");
    type = item["type"].get<std::string>();
  }
  if (type == "message") return ReadMessageItem(item, p, out);
  if (type == "function_call") return ReadFunctionCallItem(item, p, out);
  if (type == "function_call_output") return ReadFunctionOutputItem(item, p, out);
  if (type == "reasoning") return ReadReasoningItem(item, p, out);
  return BadParam(p + ".type", absl::StrCat("input items of type \"", type,
                                            "\" are not supported (message, function_call, "
                                            "function_call_output and reasoning are)"));
}

ParamError ReadInput(const OrderedJson& body, OrderedJson* messages) {
  if (!body.contains("input")) return BadParam("input", "'input' is required");
  const OrderedJson& input = body["input"];
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return WrongType("input", input, "a string or an array of items");
  if (input.empty()) return BadParam("input", "'input' is empty");
  for (size_t i = 0; i < input.size(); ++i) {
    OrderedJson m;
    if (ParamError e = ReadItem(input[i], i, &m)) return e;
    messages->push_back(std::move(m));
  }
  return std::nullopt;
}

// Function tools {type: function, name, description, parameters, strict (default true, as at
// OpenAI)}: shown to the model in the chat form; the Responses form is echoed.
ParamError ReadTools(const OrderedJson& body, ResponsesRequest* out) {
  out->echo["tools"] = OrderedJson::array();
  if (!Present(body, "tools")) return std::nullopt;
  const OrderedJson& tools = body["tools"];
  if (!tools.is_array()) return WrongType("tools", tools, "an array");
  if (tools.empty()) return std::nullopt;
  out->chat.tools = OrderedJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = absl::StrCat("tools[", i, "]");
    const OrderedJson& t = tools[i];
    if (!t.is_object() || !IsString(t, "type", "function")) {
      return BadParam(p + ".type", absl::StrCat("'", p,
                                                "': only function tools are supported ({\"type\": "
                                                "\"function\", \"name\", \"parameters\"})"));
    }
    std::string name;
    if (ParamError e = RequiredString(t, "name", p, &name)) return e;
    if (absl::Status s = CheckToolName(name, p + ".name"); !s.ok()) {
      return BadParam(p + ".name", std::string(s.message()));
    }
    if (Present(t, "strict") && !t["strict"].is_boolean()) {
      return WrongType(p + ".strict", t["strict"], "a boolean");
    }
    // The Responses API's default is strict.
    const bool strict = !Present(t, "strict") || t["strict"] == true;
    if (strict) out->chat.strict_tools.insert(name);
    OrderedJson function = {{"name", name}};
    if (Present(t, "description")) function["description"] = t["description"];
    if (Present(t, "parameters")) function["parameters"] = t["parameters"];
    out->chat.tools.push_back({{"type", "function"}, {"function", function}});
    OrderedJson echoed = t;
    echoed["strict"] = strict;
    out->echo["tools"].push_back(std::move(echoed));
  }
  return std::nullopt;
}

// "auto", "none", "required", or {"type": "function", "name"}.
ParamError ReadToolChoice(const OrderedJson& body, ResponsesRequest* out) {
  out->echo["tool_choice"] = "auto";
  if (!Present(body, "tool_choice")) return std::nullopt;
  const OrderedJson& v = body["tool_choice"];
  std::string name;
  if (v.is_string() && (v == "auto" || v == "none" || v == "required")) {
    name = v.get<std::string>();
  } else if (v.is_object() && IsString(v, "type", "function") && v.contains("name") &&
             v["name"].is_string()) {
    name = v["name"].get<std::string>();
  } else {
    return BadParam("tool_choice",
                    "'tool_choice' must be auto, none, required or {\"type\": \"function\", "
                    "\"name\"}");
  }
  absl::StatusOr<ToolChoice> choice = ParseToolChoice(name, out->chat.tools, "tool_choice");
  if (!choice.ok()) return BadParam("tool_choice", std::string(choice.status().message()));
  out->chat.tool_choice = *std::move(choice);
  out->echo["tool_choice"] = v;
  return std::nullopt;
}

// text: {format: {type: text | json_object | json_schema, name, schema, strict}, verbosity}.
ParamError ReadTextConfig(const OrderedJson& body, ResponsesRequest* out) {
  out->echo["text"] = {{"format", {{"type", "text"}}}};
  if (!Present(body, "text")) return std::nullopt;
  const OrderedJson& text = body["text"];
  if (!text.is_object()) return WrongType("text", text, "an object");
  for (const auto& [key, value] : text.items()) {
    if (key != "format" && key != "verbosity") {
      return BadParam("text." + key, absl::StrCat("unsupported parameter 'text.", key, "'"));
    }
  }
  // How terse the answer is: only the model's own length can be honoured.
  if (Present(text, "verbosity") && text["verbosity"] != "medium") {
    return BadParam("text.verbosity",
                    "only text.verbosity \"medium\" (the model's own) is "
                    "supported");
  }
  if (!Present(text, "format")) return std::nullopt;
  const OrderedJson& format = text["format"];
  if (!format.is_object()) return WrongType("text.format", format, "an object");
  if (IsString(format, "type", "json_object")) {
    out->generate.mutable_output_constraint()->set_json_object(true);
  } else if (IsString(format, "type", "json_schema")) {
    if (ParamError e = ReadJsonSchemaFormat(format, "text.format", &out->generate)) return e;
  } else if (!IsString(format, "type", "text")) {
    return BadParam("text.format.type",
                    "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  }
  out->echo["text"] = text;
  return std::nullopt;
}

// reasoning: {effort, summary}. The effort sets the template's thinking switch; a summary is
// never written (the reasoning comes back whole, as a reasoning item's content).
ParamError ReadReasoning(const OrderedJson& body, ResponsesRequest* out) {
  out->echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  if (!Present(body, "reasoning")) return std::nullopt;
  const OrderedJson& r = body["reasoning"];
  if (!r.is_object()) return WrongType("reasoning", r, "an object");
  for (const auto& [key, value] : r.items()) {
    if (key == "effort") {
      if (ParamError e =
              ReadReasoningEffort(value, "reasoning.effort", &out->chat.reasoning_effort)) {
        return e;
      }
    } else if ((key == "summary" || key == "generate_summary") && !value.is_null() &&
               !value.is_string()) {
      return WrongType("reasoning." + key, value, "a string");
    } else if (key != "summary" && key != "generate_summary") {
      return BadParam("reasoning." + key,
                      absl::StrCat("unsupported parameter 'reasoning.", key, "'"));
    }
  }
  out->echo["reasoning"] = r;
  return std::nullopt;
}

// Parameters accepted only where they change nothing here.
ParamError CheckUnsupported(const OrderedJson& body) {
  if (Present(body, "truncation") && body["truncation"] != "disabled") {
    return BadParam("truncation",
                    "only truncation \"disabled\" is supported: a conversation longer than the "
                    "context is refused, never cut");
  }
  if (Present(body, "background") && body["background"] != false) {
    return BadParam("background", "background responses are not supported");
  }
  if (Present(body, "include")) {
    const OrderedJson& include = body["include"];
    if (!include.is_array()) return WrongType("include", include, "an array");
    if (!include.empty()) {
      return BadParam("include", absl::StrCat("'include' ", include[0].dump(),
                                              " is not supported (nothing is encrypted or "
                                              "searched here)"));
    }
  }
  if (Present(body, "stream_options") && !body["stream_options"].is_object()) {
    return WrongType("stream_options", body["stream_options"], "an object");
  }
  return std::nullopt;
}

ParamError ReadLength(const OrderedJson& body, ResponsesRequest* out) {
  std::optional<int64_t> n;
  if (ParamError e =
          ReadInt(body, "max_output_tokens", 1, std::numeric_limits<int32_t>::max(), &n)) {
    return e;
  }
  if (n) out->generate.mutable_stopping()->set_max_tokens(static_cast<int32_t>(*n));
  out->echo["max_output_tokens"] = n ? OrderedJson(*n) : OrderedJson();
  return std::nullopt;
}

ParamError ReadConversation(const OrderedJson& body, ResponsesRequest* out) {
  if (ParamError e = ReadString(body, "instructions", &out->instructions)) return e;
  if (ParamError e = ReadString(body, "previous_response_id", &out->previous_response_id)) {
    return e;
  }
  if (ParamError e = ReadBool(body, "store", &out->store)) return e;
  if (ParamError e = ReadBool(body, "stream", &out->stream)) return e;
  if (ParamError e = ReadInput(body, &out->input_messages)) return e;
  out->echo["instructions"] = out->instructions ? OrderedJson(*out->instructions) : OrderedJson();
  out->echo["previous_response_id"] =
      out->previous_response_id ? OrderedJson(*out->previous_response_id) : OrderedJson();
  out->echo["store"] = out->store;
  return std::nullopt;
}

void EchoSampling(const OrderedJson& body, ResponsesRequest* out) {
  const v1::SamplingParams& s = out->generate.sampling();
  out->echo["temperature"] = s.has_temperature() ? s.temperature() : 1.0;
  out->echo["top_p"] = s.has_top_p() ? s.top_p() : 1.0;
  out->echo["parallel_tool_calls"] = out->chat.parallel_tool_calls;
  out->echo["truncation"] = "disabled";
  out->echo["metadata"] = Present(body, "metadata") ? body["metadata"] : OrderedJson::object();
  if (Present(body, "user")) out->echo["user"] = body["user"];
}

}  // namespace

ParamError ParseResponsesRequest(const std::string& body_text, const std::string& served_model,
                                 ResponsesRequest* out) {
  OrderedJson body;
  if (ParamError e = ReadBody(body_text, KnownKeys(), served_model, &body, &out->model)) return e;
  if (ParamError e = CheckIgnored(body, std::begin(kIgnored), std::end(kIgnored))) return e;
  if (ParamError e = CheckUnsupported(body)) return e;
  if (ParamError e = ReadSampling(body, out->generate.mutable_sampling())) return e;
  if (ParamError e = ReadLength(body, out)) return e;
  if (ParamError e = ReadConversation(body, out)) return e;
  if (ParamError e = ReadTools(body, out)) return e;
  if (ParamError e = ReadToolChoice(body, out)) return e;
  if (ParamError e = ReadBool(body, "parallel_tool_calls", &out->chat.parallel_tool_calls)) {
    return e;
  }
  if (ParamError e =
          ReadBool(body, "control_tokens_in_content", &out->chat.control_tokens_in_content)) {
    return e;
  }
  if (ParamError e = ReadTextConfig(body, out)) return e;
  if (ParamError e = ReadReasoning(body, out)) return e;
  EchoSampling(body, out);
  // The constraint holds from the first token, so a tool call could never be written.
  if (ToolsShown(out->chat) && Constrains(out->generate.output_constraint())) {
    return BadParam("text.format",
                    "text.format json_object or json_schema together with tools is not "
                    "supported yet (the model could not call them); use tool_choice \"none\" "
                    "or leave one out");
  }
  return std::nullopt;
}

namespace {

bool IsAssistant(const OrderedJson& m) { return m["role"] == "assistant"; }

// Appends `piece` (an assistant message) to `merged` (the assistant message before it).
void MergeInto(OrderedJson* merged, const OrderedJson& piece) {
  for (const char* key : {"content", "reasoning_content"}) {
    if (!piece.contains(key)) continue;
    const std::string joined = merged->value(key, std::string()) + piece[key].get<std::string>();
    (*merged)[key] = joined;
  }
  if (piece.contains("tool_calls")) {
    if (!merged->contains("tool_calls")) (*merged)["tool_calls"] = OrderedJson::array();
    OrderedJson& calls = (*merged)["tool_calls"];
    for (const OrderedJson& call : piece["tool_calls"]) {
      // A client that sends the previous response's function_call items again along with
      // previous_response_id: the stored call is the same call, kept once.
      const bool again =
          call.contains("id") && std::any_of(calls.begin(), calls.end(), [&](const OrderedJson& c) {
            return c.contains("id") && c["id"] == call["id"];
          });
      if (!again) calls.push_back(call);
    }
  }
}

// Whether `piece` continues the assistant message `last` rather than starting a new one: it
// adds tool calls or reasoning only, or `last` holds nothing but reasoning so far.
bool Continues(const OrderedJson& last, const OrderedJson& piece) {
  if (!IsAssistant(last) || !IsAssistant(piece)) return false;
  const bool last_has_text = !last.value("content", std::string()).empty();
  const bool last_has_calls = last.contains("tool_calls");
  const bool piece_has_text = !piece.value("content", std::string()).empty();
  if (!piece_has_text) return !piece.contains("reasoning_content") || !last_has_calls;
  return !last_has_text && !last_has_calls;
}

}  // namespace

OrderedJson MergeConversation(const std::optional<std::string>& instructions,
                              const std::vector<const OrderedJson*>& turns) {
  OrderedJson messages = OrderedJson::array();
  if (instructions.has_value())
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  for (const OrderedJson* turn : turns) {
    for (const OrderedJson& m : *turn) {
      if (!messages.empty() && Continues(messages.back(), m)) {
        MergeInto(&messages.back(), m);
      } else {
        messages.push_back(m);
      }
    }
  }
  return messages;
}

std::string NewResponsesId(const char* prefix) {
  // The kernel's CSPRNG: a stored response is fetched and continued by its id alone, so ids
  // must not be predictable from the ones a client has seen (a seeded mt19937 is).
  static constexpr char kHex[] = "0123456789abcdef";
  unsigned char bytes[24];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  std::string id = prefix;
  for (const unsigned char b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 15]);
  }
  return id;
}

}  // namespace specula
