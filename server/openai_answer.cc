#include "server/openai_answer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace specula {

OpenAiAnswer::OpenAiAnswer(const OpenAiRequest& request, std::string request_id,
                           std::function<std::string(int32_t)> decode,
                           std::optional<ChatStream> chat)
    : endpoint_(request.endpoint),
      model_(request.model),
      id_(absl::StrCat(request.endpoint == OpenAiEndpoint::kChatCompletions ? "chatcmpl-" : "cmpl-",
                       request_id)),
      created_(absl::ToUnixSeconds(absl::Now())),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      decode_(std::move(decode)),
      chat_(std::move(chat)) {}

ChatDelta OpenAiAnswer::Parse(const StreamChunk& chunk) {
  if (chat_.has_value()) return chat_->Push(chunk.text, chunk.done);
  ChatDelta delta;
  delta.content = chunk.text;
  return delta;
}

std::string OpenAiAnswer::FinishReason(const StreamChunk& chunk) const {
  if (chunk.finish == FinishReason::kLength) return "length";
  if (chat_.has_value() && chat_->EndedInToolCalls(chunk.finish)) return "tool_calls";
  return "stop";
}

OrderedJson OpenAiAnswer::Usage(const StreamChunk& chunk) const {
  return {{"prompt_tokens", chunk.prompt_tokens},
          {"completion_tokens", chunk.completion_tokens},
          {"total_tokens", chunk.prompt_tokens + chunk.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", chunk.cached_prompt_tokens}}}};
}

namespace {

// JSON has no -inf (nlohmann writes null, which clients reject): a token the sampler could never
// pick gets vLLM's floor instead.
double JsonLogprob(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0; }

}  // namespace

OrderedJson OpenAiAnswer::LogprobsOf(const std::vector<SampledToken>& tokens) const {
  auto entry = [&](int32_t token, float logprob) {
    const std::string text = decode_(token);
    OrderedJson bytes = OrderedJson::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return OrderedJson{
        {"token", text}, {"logprob", JsonLogprob(logprob)}, {"bytes", std::move(bytes)}};
  };
  OrderedJson content = OrderedJson::array();
  for (const SampledToken& t : tokens) {
    OrderedJson e = entry(t.token, t.logprob);
    OrderedJson top = OrderedJson::array();
    for (const TokenLogprob& alt : t.top) top.push_back(entry(alt.token, alt.logprob));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return content;
}

OrderedJson OpenAiAnswer::ChunkObject(OrderedJson choice) const {
  const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
  OrderedJson out = {{"id", id_},
                     {"object", chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", created_},
                     {"model", model_}};
  out["choices"] = choice.is_null() ? OrderedJson::array() : OrderedJson::array({choice});
  return out;
}

OrderedJson OpenAiAnswer::CompletionLogprobs(const std::vector<SampledToken>& tokens) {
  OrderedJson out = {{"tokens", OrderedJson::array()},
                     {"token_logprobs", OrderedJson::array()},
                     {"top_logprobs", OrderedJson::array()},
                     {"text_offset", OrderedJson::array()}};
  for (const SampledToken& t : tokens) {
    out["tokens"].push_back(decode_(t.token));
    out["token_logprobs"].push_back(JsonLogprob(t.logprob));
    OrderedJson top = OrderedJson::object();
    for (const TokenLogprob& alt : t.top) top[decode_(alt.token)] = JsonLogprob(alt.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(decode_(t.token).size());
  }
  return out;
}

OrderedJson OpenAiAnswer::ToolCallsJson(const std::vector<ChatToolCall>& calls, bool indexed) {
  OrderedJson out = OrderedJson::array();
  for (const ChatToolCall& call : calls) {
    OrderedJson c = OrderedJson::object();
    if (indexed) c["index"] = tool_calls_sent_++;
    c["id"] = call.id;
    c["type"] = "function";
    c["function"] = {{"name", call.name}, {"arguments", call.arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

std::string OpenAiAnswer::Event(const OrderedJson& object) {
  return absl::StrCat("data: ", object.dump(-1, ' ', false, OrderedJson::error_handler_t::replace),
                      "\n\n");
}

// One streamed choice for `delta` (null when there is nothing to send).
OrderedJson OpenAiAnswer::StreamChoice(ChatDelta delta, const StreamChunk& chunk) {
  const bool has_logprobs = logprobs_ && !chunk.logprobs.empty();
  if (endpoint_ == OpenAiEndpoint::kCompletions) {
    if (delta.content.empty() && !has_logprobs) return OrderedJson();
    return {{"index", 0},
            {"text", delta.content},
            {"logprobs", has_logprobs ? CompletionLogprobs(chunk.logprobs) : OrderedJson()},
            {"finish_reason", OrderedJson()}};
  }
  OrderedJson d = OrderedJson::object();
  if (!sent_role_) {
    d["role"] = "assistant";
    sent_role_ = true;
  }
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.tool_calls.empty()) d["tool_calls"] = ToolCallsJson(delta.tool_calls, true);
  if (d.empty() && !has_logprobs) return OrderedJson();
  if (d.contains("role") && !d.contains("content")) d["content"] = "";
  return {{"index", 0},
          {"delta", std::move(d)},
          {"logprobs",
           has_logprobs ? OrderedJson{{"content", LogprobsOf(chunk.logprobs)}} : OrderedJson()},
          {"finish_reason", OrderedJson()}};
}

std::string OpenAiAnswer::StreamEvents(const StreamChunk& chunk) {
  if (chunk.done && !chunk.status.ok()) {
    return absl::StrCat(
        Event(nlohmann::ordered_json::parse(OpenAiErrorJson(OpenAiErrorFrom(chunk.status)))),
        "data: [DONE]\n\n");
  }
  std::string events;
  OrderedJson choice = StreamChoice(Parse(chunk), chunk);
  if (!choice.is_null()) events += Event(ChunkObject(std::move(choice)));
  if (!chunk.done) return events;
  OrderedJson last = {{"index", 0}};
  if (endpoint_ == OpenAiEndpoint::kChatCompletions) {
    last["delta"] = OrderedJson::object();
  } else {
    last["text"] = "";
  }
  last["logprobs"] = OrderedJson();
  last["finish_reason"] = FinishReason(chunk);
  events += Event(ChunkObject(std::move(last)));
  if (include_usage_) {
    OrderedJson usage = ChunkObject(OrderedJson());
    usage["usage"] = Usage(chunk);
    events += Event(usage);
  }
  return events + "data: [DONE]\n\n";
}

void OpenAiAnswer::Accumulate(const StreamChunk& chunk) {
  ChatDelta delta = Parse(chunk);
  content_ += delta.content;
  reasoning_ += delta.reasoning;
  for (ChatToolCall& call : delta.tool_calls) tool_calls_.push_back(std::move(call));
  for (const SampledToken& t : chunk.logprobs) logprob_tokens_.push_back(t);
  if (chunk.done) {
    finish_reason_ = FinishReason(chunk);
    usage_ = Usage(chunk);
  }
}

OrderedJson OpenAiAnswer::Final() {
  const bool chat = endpoint_ == OpenAiEndpoint::kChatCompletions;
  OrderedJson choice = {{"index", 0}};
  if (chat) {
    OrderedJson message = {{"role", "assistant"}};
    // OpenAI: content is null when the answer is only tool calls.
    message["content"] =
        content_.empty() && !tool_calls_.empty() ? OrderedJson() : OrderedJson(content_);
    if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) message["tool_calls"] = ToolCallsJson(tool_calls_, false);
    choice["message"] = std::move(message);
    choice["logprobs"] =
        logprobs_ ? OrderedJson{{"content", LogprobsOf(logprob_tokens_)}} : OrderedJson();
  } else {
    choice["text"] = content_;
    choice["logprobs"] = logprobs_ ? CompletionLogprobs(logprob_tokens_) : OrderedJson();
  }
  choice["finish_reason"] = finish_reason_;
  return {{"id", id_},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", OrderedJson::array({std::move(choice)})},
          {"usage", usage_}};
}

}  // namespace specula
