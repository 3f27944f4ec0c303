#include "server/responses_answer.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/openai_request.h"

namespace specula {

ResponsesAnswer::ResponsesAnswer(const ResponsesRequest& request, std::string response_id,
                                 ChatStream chat)
    : echo_(request.echo),
      model_(request.model),
      streaming_(request.stream),
      id_(std::move(response_id)),
      created_at_(absl::ToUnixSeconds(absl::Now())),
      chat_(std::move(chat)) {}

std::string ResponsesAnswer::Event(const char* type, OrderedJson fields) {
  if (!streaming_) return "";  // a JSON answer: the items are kept, no event is written
  OrderedJson event = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : fields.items()) event[key] = std::move(value);
  return absl::StrCat("event: ", type,
                      "\ndata: ", event.dump(-1, ' ', false, OrderedJson::error_handler_t::replace),
                      "\n\n");
}

OrderedJson ResponsesAnswer::ResponseObject(const char* status) const {
  OrderedJson r = {
      {"id", id_},        {"object", "response"}, {"created_at", created_at_},
      {"status", status}, {"error", error_},      {"incomplete_details", incomplete_details_},
      {"model", model_},  {"output", output_}};
  for (const auto& [key, value] : echo_.items()) r[key] = value;
  r["usage"] = usage_;
  return r;
}

std::string ResponsesAnswer::StartEvents() {
  std::string events = Event("response.created", {{"response", ResponseObject("in_progress")}});
  return events + Event("response.in_progress", {{"response", ResponseObject("in_progress")}});
}

std::string ResponsesAnswer::OpenItem(Open kind) {
  if (open_ == kind) return "";
  std::string events = CloseItem("completed");
  open_ = kind;
  open_text_.clear();
  const int64_t index = static_cast<int64_t>(output_.size());
  if (kind == Open::kReasoning) {
    open_id_ = NewResponsesId("rs_");
    OrderedJson item = {{"id", open_id_},
                        {"type", "reasoning"},
                        {"summary", OrderedJson::array()},
                        {"content", OrderedJson::array()},
                        {"status", "in_progress"}};
    events += Event("response.output_item.added", {{"output_index", index}, {"item", item}});
    return events + Event("response.content_part.added",
                          {{"item_id", open_id_},
                           {"output_index", index},
                           {"content_index", 0},
                           {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  }
  open_id_ = NewResponsesId("msg_");
  OrderedJson item = {{"id", open_id_},
                      {"type", "message"},
                      {"status", "in_progress"},
                      {"role", "assistant"},
                      {"content", OrderedJson::array()}};
  events += Event("response.output_item.added", {{"output_index", index}, {"item", item}});
  return events +
         Event("response.content_part.added",
               {{"item_id", open_id_},
                {"output_index", index},
                {"content_index", 0},
                {"part",
                 {{"type", "output_text"}, {"text", ""}, {"annotations", OrderedJson::array()}}}});
}

std::string ResponsesAnswer::CloseItem(const char* status) {
  if (open_ == Open::kNone) return "";
  const int64_t index = static_cast<int64_t>(output_.size());
  const bool reasoning = open_ == Open::kReasoning;
  OrderedJson part = reasoning ? OrderedJson{{"type", "reasoning_text"}, {"text", open_text_}}
                               : OrderedJson{{"type", "output_text"},
                                             {"text", open_text_},
                                             {"annotations", OrderedJson::array()}};
  OrderedJson where = {{"item_id", open_id_}, {"output_index", index}, {"content_index", 0}};
  OrderedJson done = where;
  done["text"] = open_text_;
  std::string events =
      Event(reasoning ? "response.reasoning_text.done" : "response.output_text.done", done);
  OrderedJson part_done = where;
  part_done["part"] = part;
  events += Event("response.content_part.done", part_done);
  OrderedJson item = reasoning ? OrderedJson{{"id", open_id_},
                                             {"type", "reasoning"},
                                             {"summary", OrderedJson::array()},
                                             {"content", OrderedJson::array({part})},
                                             {"status", status}}
                               : OrderedJson{{"id", open_id_},
                                             {"type", "message"},
                                             {"status", status},
                                             {"role", "assistant"},
                                             {"content", OrderedJson::array({part})}};
  events += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  open_ = Open::kNone;
  return events;
}

std::string ResponsesAnswer::FunctionCall(const ChatToolCall& call) {
  std::string events = CloseItem("completed");
  const int64_t index = static_cast<int64_t>(output_.size());
  const std::string item_id = NewResponsesId("fc_");
  OrderedJson item = {{"id", item_id},      {"type", "function_call"}, {"status", "in_progress"},
                      {"call_id", call.id}, {"name", call.name},       {"arguments", ""}};
  events += Event("response.output_item.added", {{"output_index", index}, {"item", item}});
  events += Event("response.function_call_arguments.delta",
                  {{"item_id", item_id}, {"output_index", index}, {"delta", call.arguments}});
  events += Event("response.function_call_arguments.done", {{"item_id", item_id},
                                                            {"output_index", index},
                                                            {"name", call.name},
                                                            {"arguments", call.arguments}});
  item["status"] = "completed";
  item["arguments"] = call.arguments;
  events += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  OrderedJson arguments = OrderedJson::parse(call.arguments, nullptr, false);
  tool_calls_.push_back(
      {{"id", call.id},
       {"type", "function"},
       {"function",
        {{"name", call.name},
         {"arguments", arguments.is_object() ? arguments : OrderedJson::object()}}}});
  return events;
}

std::string ResponsesAnswer::Delta(const ChatDelta& delta) {
  std::string events;
  if (!delta.reasoning.empty()) {
    events += OpenItem(Open::kReasoning);
    open_text_ += delta.reasoning;
    reasoning_ += delta.reasoning;
    events += Event("response.reasoning_text.delta", {{"item_id", open_id_},
                                                      {"output_index", output_.size()},
                                                      {"content_index", 0},
                                                      {"delta", delta.reasoning}});
  }
  if (!delta.content.empty()) {
    events += OpenItem(Open::kMessage);
    open_text_ += delta.content;
    content_ += delta.content;
    events += Event("response.output_text.delta", {{"item_id", open_id_},
                                                   {"output_index", output_.size()},
                                                   {"content_index", 0},
                                                   {"delta", delta.content},
                                                   {"logprobs", OrderedJson::array()}});
  }
  for (const ChatToolCall& call : delta.tool_calls) events += FunctionCall(call);
  return events;
}

std::string ResponsesAnswer::End(const StreamChunk& chunk) {
  ended_ = true;
  if (!chunk.status.ok()) {
    const OpenAiError e = OpenAiErrorFrom(chunk.status);
    error_ = {{"code", e.http_status >= 500 ? "server_error" : e.type}, {"message", e.message}};
    std::string events = CloseItem("incomplete");
    status_ = "failed";
    return events + Event("response.failed", {{"response", Response()}});
  }
  const bool cut = chunk.finish == FinishReason::kLength;
  std::string events = CloseItem(cut ? "incomplete" : "completed");
  usage_ = {{"input_tokens", chunk.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", chunk.cached_prompt_tokens}}},
            {"output_tokens", chunk.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
            {"total_tokens", chunk.prompt_tokens + chunk.completion_tokens}};
  if (cut) {
    status_ = "incomplete";
    incomplete_details_ = {{"reason", "max_output_tokens"}};
    return events + Event("response.incomplete", {{"response", Response()}});
  }
  status_ = "completed";
  return events + Event("response.completed", {{"response", Response()}});
}

std::string ResponsesAnswer::StreamEvents(const StreamChunk& chunk) {
  if (ended_) return "";
  ChatDelta delta = chat_.Push(chunk.text, chunk.done);
  // Tokens whose text was reasoning only (a chunk that also ends the reasoning counts as
  // output): the usage's reasoning_tokens.
  if (!delta.reasoning.empty() && delta.content.empty() && delta.tool_calls.empty()) {
    reasoning_tokens_ += static_cast<int64_t>(chunk.tokens.size());
  }
  std::string events = Delta(delta);
  if (chunk.done) events += End(chunk);
  return events;
}

OrderedJson ResponsesAnswer::Response() const { return ResponseObject(status_.c_str()); }

OrderedJson ResponsesAnswer::OutputMessage() const {
  OrderedJson m = {{"role", "assistant"}, {"content", content_}};
  if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
  if (!tool_calls_.empty()) m["tool_calls"] = tool_calls_;
  return m;
}

}  // namespace specula
