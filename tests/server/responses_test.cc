// The Responses API's pieces: request bodies (items, tools, refusals by name), the conversation
// rebuilt from stored turns, the store's bounds, and the answer's items, events and stored turn.
#include <memory>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/response_store.h"
#include "server/responses_answer.h"
#include "server/responses_request.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ParamError Parse(const std::string& body, ResponsesRequest* out) {
  return ParseResponsesRequest(body, "m", out);
}

TEST(ResponsesRequestTest, ItemsBecomeCanonicalMessages) {
  ResponsesRequest r;
  ASSERT_FALSE(Parse(R"({"model": "m", "instructions": "be brief", "input": [
      {"role": "developer", "content": "rules"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                      {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "42"}]})",
                     &r));
  const OrderedJson& m = r.input_messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], OrderedJson::parse(R"({"role": "system", "content": "rules"})"));
  EXPECT_EQ(m[1], OrderedJson::parse(R"({"role": "user", "content": "ab"})"));
  EXPECT_EQ(m[2]["reasoning_content"], "think");
  EXPECT_EQ(m[3]["tool_calls"][0], OrderedJson::parse(R"({"id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": {"x": 1}}})"));
  EXPECT_EQ(m[4], OrderedJson::parse(R"({"role": "tool", "tool_call_id": "c1",
                                         "content": "42"})"));
  EXPECT_EQ(r.instructions, "be brief");
  EXPECT_TRUE(r.store);  // OpenAI's default
  EXPECT_EQ(r.echo["instructions"], "be brief");
}

TEST(ResponsesRequestTest, ParametersReachTheRequest) {
  ResponsesRequest r;
  ASSERT_FALSE(Parse(R"({"model": "m", "input": "hi", "store": false, "stream": true,
      "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9, "parallel_tool_calls": false,
      "reasoning": {"effort": "low", "summary": "auto"}, "previous_response_id": "resp_1",
      "tools": [{"type": "function", "name": "f", "description": "d",
                 "parameters": {"type": "object"}, "strict": false}],
      "tool_choice": {"type": "function", "name": "f"},
      "metadata": {"k": "v"}, "user": "u", "prompt_cache_key": "p", "safety_identifier": "s",
      "truncation": "disabled", "include": [], "background": false})",
                     &r));
  EXPECT_EQ(r.input_messages, OrderedJson::parse(R"([{"role": "user", "content": "hi"}])"));
  EXPECT_FALSE(r.store);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.generate.stopping().max_tokens(), 7);
  EXPECT_FLOAT_EQ(r.generate.sampling().temperature(), 0.5f);
  EXPECT_FALSE(r.chat.parallel_tool_calls);
  EXPECT_EQ(r.chat.reasoning_effort, "low");
  EXPECT_EQ(r.previous_response_id, "resp_1");
  EXPECT_EQ(r.chat.tools, OrderedJson::parse(R"([{"type": "function", "function":
      {"name": "f", "description": "d", "parameters": {"type": "object"}}}])"));
  EXPECT_EQ(r.chat.tool_choice.kind, ToolChoice::Kind::kFunction);
  EXPECT_TRUE(r.chat.strict_tools.empty());
  EXPECT_EQ(r.echo["tool_choice"]["name"], "f");
  EXPECT_EQ(r.echo["metadata"]["k"], "v");
  EXPECT_EQ(r.echo["max_output_tokens"], 7);
}

// The Responses API's function tools are strict unless they say otherwise, as at OpenAI.
TEST(ResponsesRequestTest, ToolsAreStrictByDefault) {
  ResponsesRequest r;
  ASSERT_FALSE(Parse(R"({"model": "m", "input": "hi", "tools": [
      {"type": "function", "name": "a"}, {"type": "function", "name": "b", "strict": true},
      {"type": "function", "name": "c", "strict": false}]})",
                     &r));
  EXPECT_THAT(r.chat.strict_tools, ::testing::UnorderedElementsAre("a", "b"));
  EXPECT_EQ(r.echo["tools"][0]["strict"], true);
  EXPECT_EQ(r.echo["tools"][2]["strict"], false);
}

TEST(ResponsesRequestTest, TextFormatIsTheOutputConstraint) {
  ResponsesRequest r;
  ASSERT_FALSE(Parse(R"({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema",
      "name": "n", "schema": {"type": "object"}, "strict": true}}})",
                     &r));
  EXPECT_EQ(r.generate.output_constraint().json_schema(), R"({"type":"object"})");
  EXPECT_TRUE(r.generate.output_constraint().strict());
  ResponsesRequest o;
  ASSERT_FALSE(Parse(R"({"model": "m", "input": "hi", "text": {"format": {"type":
      "json_object"}}})",
                     &o));
  EXPECT_TRUE(o.generate.output_constraint().json_object());
}

// Each refusal names the parameter, so a client knows what to change.
TEST(ResponsesRequestTest, RefusalsNameTheParameter) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"model": "m"})", "input"},
      {R"({"input": "hi"})", "model"},
      {R"({"model": "m", "input": []})", "input"},
      {R"({"model": "m", "input": 3})", "input"},
      {R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image",
          "image_url": "x"}]}]})",
       "input[0].content[0]"},
      {R"({"model": "m", "input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
      {R"({"model": "m", "input": [{"type": "item_reference", "id": "x"}]})", "input[0].type"},
      {R"({"model": "m", "input": [{"type": "function_call", "name": "f",
          "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
          "arguments": "[1]"}]})",
       "input[0].arguments"},
      {R"({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]})",
       "input[0].output"},
      {R"({"model": "m", "input": "x", "tools": [{"type": "web_search_preview"}]})",
       "tools[0].type"},
      {R"({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f",
          "strict": "yes"}]})",
       "tools[0].strict"},
      {R"({"model": "m", "input": "x", "tool_choice": "required"})", "tool_choice"},
      {R"({"model": "m", "input": "x", "tools": [{"type": "function",
          "name": "x<|im_end|>"}]})",
       "tools[0].name"},
      {R"({"model": "m", "input": "x", "truncation": "auto"})", "truncation"},
      {R"({"model": "m", "input": "x", "background": true})", "background"},
      {R"({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]})", "include"},
      {R"({"model": "m", "input": "x", "text": {"verbosity": "low"}})", "text.verbosity"},
      {R"({"model": "m", "input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"model": "m", "input": "x", "reasoning": {"effort": "max"}})", "reasoning.effort"},
      {R"({"model": "m", "input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"model": "m", "input": "x", "store": "yes"})", "store"},
      {R"({"model": "m", "input": "x", "metadata": "v"})", "metadata"},
      {R"({"model": "m", "input": "x", "n": 2})", "n"},
      {R"({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}},
          "tools": [{"type": "function", "name": "f"}]})",
       "text.format"},
  };
  for (const auto& [body, param] : cases) {
    ResponsesRequest r;
    ParamError e = Parse(body, &r);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
    EXPECT_EQ(e->http_status, 400) << body;
  }
  ResponsesRequest r;
  ParamError e = Parse(R"({"model": "other", "input": "x"})", &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 404);
}

TEST(ResponsesIdTest, FortyEightHexDigitsNeverRepeated) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewResponsesId("resp_");
    ASSERT_EQ(id.size(), 5u + 48u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    EXPECT_TRUE(seen.insert(id).second);
  }
}

TEST(MergeConversationTest, AssistantPiecesOfATurnBecomeOneMessage) {
  const OrderedJson first = OrderedJson::parse(R"([
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": "", "reasoning_content": "r"},
      {"role": "assistant", "content": "let me look"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "b"}]}])");
  const OrderedJson second = OrderedJson::parse(R"([
      {"role": "tool", "tool_call_id": "a", "content": "1"},
      {"role": "assistant", "content": "done"},
      {"role": "assistant", "content": "and more"}])");
  const OrderedJson m = MergeConversation("sys", {&first, &second});
  EXPECT_EQ(m, OrderedJson::parse(R"([
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": "let me look", "reasoning_content": "r",
       "tool_calls": [{"id": "a"}, {"id": "b"}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"},
      {"role": "assistant", "content": "done"},
      {"role": "assistant", "content": "and more"}])"));
  EXPECT_EQ(MergeConversation(std::nullopt, {&second})[0]["role"], "tool");
  // The previous response's call sent again with previous_response_id: kept once.
  const OrderedJson stored = OrderedJson::parse(R"([{"role": "user", "content": "q"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]}])");
  const OrderedJson resent = OrderedJson::parse(R"([
      {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"}])");
  const OrderedJson once = MergeConversation(std::nullopt, {&stored, &resent});
  ASSERT_EQ(once.size(), 3u);
  EXPECT_EQ(once[1]["tool_calls"].size(), 1u);
}

std::shared_ptr<StoredResponse> Stored(const std::string& id,
                                       std::shared_ptr<const StoredResponse> previous = nullptr) {
  auto r = std::make_shared<StoredResponse>();
  r->id = id;
  r->turn = OrderedJson::array({{{"role", "user"}, {"content", id}}});
  r->previous = std::move(previous);
  return r;
}

TEST(ResponseStoreTest, KeepsTheMostRecentlyUsedWithinTheBound) {
  ResponseStore store(2, absl::Seconds(100));
  const absl::Time t0 = absl::UnixEpoch();
  store.Put(Stored("a"), t0);
  store.Put(Stored("b"), t0 + absl::Seconds(1));
  ASSERT_NE(store.Find("a", t0 + absl::Seconds(2)), nullptr);  // a is now the most recent
  store.Put(Stored("c"), t0 + absl::Seconds(3));
  EXPECT_EQ(store.Find("b", t0 + absl::Seconds(4)), nullptr);
  EXPECT_NE(store.Find("a", t0 + absl::Seconds(4)), nullptr);
  EXPECT_NE(store.Find("c", t0 + absl::Seconds(4)), nullptr);
  EXPECT_EQ(store.size(), 2);
  EXPECT_TRUE(store.Erase("c"));
  EXPECT_FALSE(store.Erase("c"));
  EXPECT_EQ(store.Find("c", t0 + absl::Seconds(5)), nullptr);
}

TEST(ResponseStoreTest, DropsWhatWentUnusedPastTheTtl) {
  ResponseStore store(10, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  store.Put(Stored("a"), t0);
  store.Put(Stored("b"), t0 + absl::Seconds(5));
  EXPECT_NE(store.Find("b", t0 + absl::Seconds(14)), nullptr);
  EXPECT_EQ(store.Find("a", t0 + absl::Seconds(10)), nullptr);
  EXPECT_NE(store.Find("b", t0 + absl::Seconds(23)), nullptr);  // used at 14: alive until 24
  EXPECT_EQ(store.Find("b", t0 + absl::Seconds(34)), nullptr);
}

// A continued response dropped from the index still gives its turns to the conversations that
// continue it; and a chain as long as a context releases without deep recursion.
TEST(ResponseStoreTest, AConversationKeepsItsEarlierTurns) {
  ResponseStore store(1, absl::Seconds(100));
  auto a = Stored("a");
  store.Put(a);
  store.Put(Stored("b", a));
  a.reset();
  EXPECT_EQ(store.Find("a"), nullptr);
  std::shared_ptr<const StoredResponse> b = store.Find("b");
  ASSERT_NE(b, nullptr);
  std::vector<std::string> turns;
  for (const OrderedJson* t : b->Conversation()) turns.push_back((*t)[0]["content"]);
  EXPECT_THAT(turns, ElementsAre("a", "b"));

  std::shared_ptr<const StoredResponse> chain;
  for (int i = 0; i < 200000; ++i) chain = Stored("x", std::move(chain));
  chain.reset();  // would overflow the stack if each link's destructor recursed
}

StreamChunk Chunk(const std::string& text, int tokens, bool done,
                  FinishReason finish = FinishReason::kStop) {
  StreamChunk c;
  c.text = text;
  c.tokens.assign(tokens, 1);
  c.done = done;
  if (done) {
    c.finish = finish;
    c.prompt_tokens = 10;
    c.completion_tokens = 6;
    c.cached_prompt_tokens = 4;
  }
  return c;
}

ResponsesAnswer AnswerFor(const std::string& body) {
  ResponsesRequest r;
  EXPECT_FALSE(Parse(body, &r));
  ChatOutputFormat format;
  format.tool_calls = ToolCallSyntax::kHermes;
  format.reasoning = true;
  RenderedChat rendered;
  rendered.parse_tool_calls = true;
  return ResponsesAnswer(r, "resp_x", ChatStream(format, rendered));
}

// The event types, in order, of an SSE text.
std::vector<std::string> EventTypes(const std::string& sse) {
  std::vector<std::string> types;
  for (absl::string_view line : absl::StrSplit(sse, '\n')) {
    if (absl::ConsumePrefix(&line, "event: ")) types.emplace_back(line);
  }
  return types;
}

TEST(ResponsesAnswerTest, StreamsReasoningTextAndACallAsItems) {
  ResponsesAnswer answer = AnswerFor(R"({"model": "m", "input": "hi", "stream": true,
      "tools": [{"type": "function", "name": "get_weather"}]})");
  std::string sse = answer.StartEvents();
  sse += answer.StreamEvents(Chunk("<think>hmm", 2, false));
  sse += answer.StreamEvents(Chunk("</think>Sure.", 2, false));
  sse += answer.StreamEvents(
      Chunk("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}</tool_call>", 20,
            true));
  EXPECT_THAT(
      EventTypes(sse),
      ElementsAre("response.created", "response.in_progress", "response.output_item.added",
                  "response.content_part.added", "response.reasoning_text.delta",
                  "response.reasoning_text.done", "response.content_part.done",
                  "response.output_item.done", "response.output_item.added",
                  "response.content_part.added", "response.output_text.delta",
                  "response.output_text.done", "response.content_part.done",
                  "response.output_item.done", "response.output_item.added",
                  "response.function_call_arguments.delta", "response.function_call_arguments.done",
                  "response.output_item.done", "response.completed"));
  // Sequence numbers count every event from 0.
  EXPECT_THAT(sse, HasSubstr(R"("type":"response.created","sequence_number":0,)"));
  EXPECT_THAT(sse, HasSubstr(R"("type":"response.completed","sequence_number":18,)"));
  const OrderedJson r = answer.Response();
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["id"], "resp_x");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "hmm");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Sure.");
  EXPECT_EQ(r["output"][2]["type"], "function_call");
  EXPECT_EQ(r["output"][2]["name"], "get_weather");
  EXPECT_EQ(r["output"][2]["arguments"], R"({"days":3})");
  EXPECT_TRUE(absl::StartsWith(r["output"][2]["call_id"].get<std::string>(), "call_"));
  EXPECT_EQ(r["usage"], OrderedJson::parse(R"({"input_tokens": 10,
      "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 6,
      "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 16})"));
  EXPECT_EQ(r["tools"][0]["name"], "get_weather");
  // The stored turn's end: what the template renders when the conversation continues.
  const OrderedJson m = answer.OutputMessage();
  EXPECT_EQ(m["content"], "Sure.");
  EXPECT_EQ(m["reasoning_content"], "hmm");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], OrderedJson::parse(R"({"days": 3})"));
  EXPECT_EQ(m["tool_calls"][0]["id"], r["output"][2]["call_id"]);
  EXPECT_TRUE(answer.succeeded());
}

TEST(ResponsesAnswerTest, ALengthCutIsIncomplete) {
  ResponsesAnswer answer = AnswerFor(R"({"model": "m", "input": "hi"})");
  answer.Accumulate(Chunk("Hel", 1, false));
  answer.Accumulate(Chunk("lo", 1, true, FinishReason::kLength));
  const OrderedJson r = answer.Response();
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Hello");
  EXPECT_TRUE(answer.succeeded());
}

TEST(ResponsesAnswerTest, AFailedEndIsResponseFailed) {
  ResponsesAnswer answer = AnswerFor(R"({"model": "m", "input": "hi", "stream": true})");
  StreamChunk end;
  end.done = true;
  end.status = absl::UnavailableError("draining");
  const std::string sse = answer.StreamEvents(end);
  EXPECT_THAT(EventTypes(sse), ElementsAre("response.failed"));
  EXPECT_THAT(sse, HasSubstr(R"("status":"failed")"));
  EXPECT_THAT(sse, HasSubstr(R"("error":{"code":"server_error","message":"draining"})"));
  EXPECT_FALSE(answer.succeeded());
}

}  // namespace
}  // namespace specula
