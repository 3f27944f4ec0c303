#include "server/responses_service.h"

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/openai_call.h"
#include "server/openai_request.h"
#include "server/responses_answer.h"
#include "server/responses_request.h"

namespace specula {
namespace {

constexpr char kRoute[] = "/v1/responses";

OpenAiError ResponseNotFound(const std::string& id, const char* param) {
  return {404, "invalid_request_error",
          absl::StrCat("no response with id '", id,
                       "' is stored (unknown, deleted, or dropped "
                       "past server.responses limits)"),
          param, "response_not_found"};
}

class ResponsesProtocol : public OpenAiProtocol {
 public:
  ResponsesProtocol(const std::string* served_model, ResponseStore* store)
      : served_model_(served_model), store_(store) {}

  std::optional<OpenAiError> Parse(const std::string& body) override {
    if (ParamError e = ParseResponsesRequest(body, *served_model_, &request_)) return e;
    std::vector<const OrderedJson*> turns;
    if (request_.previous_response_id.has_value()) {
      previous_ = store_->Find(*request_.previous_response_id);
      if (previous_ == nullptr) {
        return ResponseNotFound(*request_.previous_response_id, "previous_response_id");
      }
      turns = previous_->Conversation();
    }
    turns.push_back(&request_.input_messages);
    request_.chat.messages = MergeConversation(request_.instructions, turns);
    response_id_ = NewResponsesId("resp_");
    // The response's KV stays under its own session, for the requests that continue it.
    if (request_.store) request_.generate.set_session_id(response_id_);
    return std::nullopt;
  }
  v1::GenerateRequest& generate() override { return request_.generate; }
  const ChatRequest* chat() const override { return &request_.chat; }
  bool stream() const override { return request_.stream; }
  void Begin(const std::string& /*request_id*/, const Tokenizer& /*tokenizer*/,
             std::optional<ChatStream> chat) override {
    answer_.emplace(request_, response_id_, *std::move(chat));
  }
  std::string StartEvents() override { return answer_->StartEvents(); }
  std::string StreamEvents(const StreamChunk& chunk) override {
    std::string events = answer_->StreamEvents(chunk);
    if (chunk.done) Save();
    return events;
  }
  void Accumulate(const StreamChunk& chunk) override {
    answer_->Accumulate(chunk);
    if (chunk.done) Save();
  }
  OrderedJson Final() override { return answer_->Response(); }
  int malformed_tool_calls() const override { return answer_->malformed_tool_calls(); }

 private:
  // Before the client hears the end, so that it can continue the response at once.
  void Save() {
    if (!request_.store || !answer_->succeeded()) return;
    auto stored = std::make_shared<StoredResponse>();
    stored->id = response_id_;
    stored->response = answer_->Response();
    stored->turn = std::move(request_.input_messages);
    stored->turn.push_back(answer_->OutputMessage());
    stored->previous = std::move(previous_);
    store_->Put(std::move(stored));
  }

  const std::string* const served_model_;
  ResponseStore* const store_;
  ResponsesRequest request_;
  std::shared_ptr<const StoredResponse> previous_;
  std::string response_id_;
  std::optional<ResponsesAnswer> answer_;
};

// GET returns the stored response; DELETE forgets it (its KV is the cache's, freed by the
// session TTL or when space is needed).
HttpResponse StoredResponseRoute(ResponseStore* store, const HttpRequest& request) {
  const std::string id = request.path.substr(sizeof(kRoute));  // after "/v1/responses/"
  if (request.method == "DELETE") {
    if (!store->Erase(id)) return OpenAiErrorResponse(ResponseNotFound(id, "response_id"));
    return JsonResponse(200, {{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  std::shared_ptr<const StoredResponse> stored = store->Find(id);
  if (stored == nullptr) return OpenAiErrorResponse(ResponseNotFound(id, "response_id"));
  return JsonResponse(200, stored->response);
}

}  // namespace

std::vector<HttpRoute> ResponsesRoutes(CallEnv* env, const std::string* served_model,
                                       ResponseStore* store) {
  HttpRoute create{kRoute, {"POST"}, nullptr};
  create.async_handler = [env, served_model, store](const HttpRequest& request,
                                                    std::shared_ptr<HttpExchange> exchange) {
    StartOpenAiCall(env, std::make_unique<ResponsesProtocol>(served_model, store), request,
                    std::move(exchange));
  };
  HttpRoute stored{
      absl::StrCat(kRoute, "/"), {"GET", "DELETE"}, [store](const HttpRequest& request) {
        return StoredResponseRoute(store, request);
      }};
  stored.with_id = true;
  return {std::move(create), std::move(stored)};
}

}  // namespace specula
