#include "server/openai_service.h"

#include <memory>

#include "absl/time/clock.h"
#include "engine/common/build_info.h"
#include "server/openai_call.h"
#include "server/request_convert.h"
#include "server/responses_service.h"

namespace specula {
namespace {

// Whether `request` may use the API: authentication off, or an `authorization: Bearer` header
// with one of the tokens.
bool Authorized(const CallEnv& env, const HttpRequest& request) {
  if (env.auth == nullptr) return true;
  const std::string* header = request.header("authorization");
  return header != nullptr && env.auth->Allows(*header);
}

// Chat completions and completions: the body parsed into an OpenAiRequest, the output written
// as OpenAiAnswer's objects.
class CompletionsProtocol : public OpenAiProtocol {
 public:
  CompletionsProtocol(OpenAiEndpoint endpoint, const std::string* served_model)
      : endpoint_(endpoint), served_model_(served_model) {}

  std::optional<OpenAiError> Parse(const std::string& body) override {
    return ParseOpenAiRequest(endpoint_, body, *served_model_, &request_);
  }
  v1::GenerateRequest& generate() override { return request_.generate; }
  const ChatRequest* chat() const override {
    return request_.chat.has_value() ? &*request_.chat : nullptr;
  }
  bool stream() const override { return request_.stream; }
  void Begin(const std::string& request_id, const Tokenizer& tokenizer,
             std::optional<ChatStream> chat) override {
    answer_.emplace(
        request_, request_id,
        // A token's own bytes (SentencePiece's "▁" as a space, a byte-fallback token as its
        // byte), not a decode of it alone, which strips a leading space and turns a partial
        // UTF-8 sequence into U+FFFD: logprobs' "bytes" are for exactly those tokens.
        [&tokenizer](int32_t id) { return tokenizer.TokenBytes(id); }, std::move(chat));
  }
  std::string StreamEvents(const StreamChunk& chunk) override {
    return answer_->StreamEvents(chunk);
  }
  void Accumulate(const StreamChunk& chunk) override { answer_->Accumulate(chunk); }
  OrderedJson Final() override { return answer_->Final(); }
  int malformed_tool_calls() const override { return answer_->malformed_tool_calls(); }

 private:
  const OpenAiEndpoint endpoint_;
  const std::string* const served_model_;
  OpenAiRequest request_;
  std::optional<OpenAiAnswer> answer_;
};

}  // namespace

OpenAiService::OpenAiService(CallEnv* env, std::string served_model, int64_t max_context_tokens,
                             ResponseStore* responses)
    : env_(env),
      served_model_(std::move(served_model)),
      max_context_tokens_(max_context_tokens),
      responses_(responses),
      created_(absl::ToUnixSeconds(absl::Now())) {}

HttpResponse OpenAiService::ErrorResponse(int status, const std::string& message) {
  OpenAiError e;
  e.http_status = status;
  e.type = status == 404 ? "not_found_error" : "invalid_request_error";
  e.message = message;
  return OpenAiErrorResponse(e);
}

OrderedJson OpenAiService::ModelObject() const {
  return {{"id", served_model_},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "specula"},
          {"max_model_len", max_context_tokens_},
          {"specula_version", std::string(GetBuildInfo().version)}};
}

HttpResponse OpenAiService::Health() const {
  if (env_->failing.load()) return JsonResponse(503, {{"status", "failing"}});
  if (env_->draining.load()) return JsonResponse(503, {{"status", "draining"}});
  if (env_->stalled.load()) return JsonResponse(503, {{"status", "stalled"}});
  return JsonResponse(200, {{"status", "ok"}});
}

std::optional<HttpResponse> OpenAiService::Authenticate(const HttpRequest& request) const {
  if (Authorized(*env_, request)) return std::nullopt;
  return OpenAiErrorResponse(OpenAiErrorFrom(absl::UnauthenticatedError(kUnauthenticatedMessage)));
}

std::vector<std::string> OpenAiService::OpenPaths() { return {"/health"}; }

std::vector<HttpRoute> OpenAiService::Routes() {
  auto generation = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const HttpRequest& request, std::shared_ptr<HttpExchange> exchange) {
      StartOpenAiCall(env_, std::make_unique<CompletionsProtocol>(endpoint, &served_model_),
                      request, std::move(exchange));
    };
  };
  std::vector<HttpRoute> routes;
  HttpRoute chat{"/v1/chat/completions", {"POST"}, nullptr};
  chat.async_handler = generation(OpenAiEndpoint::kChatCompletions);
  HttpRoute completions{"/v1/completions", {"POST"}, nullptr};
  completions.async_handler = generation(OpenAiEndpoint::kCompletions);
  routes.push_back(std::move(chat));
  routes.push_back(std::move(completions));
  // Every route but /health needs a token (Authenticate, run by the listener before routing).
  routes.push_back({"/v1/models", {"GET"}, [this](const HttpRequest&) {
                      return JsonResponse(
                          200, {{"object", "list"}, {"data", OrderedJson::array({ModelObject()})}});
                    }});
  routes.push_back({"/v1/models/" + served_model_, {"GET"}, [this](const HttpRequest&) {
                      return JsonResponse(200, ModelObject());
                    }});
  routes.push_back({"/health", {"GET", "HEAD"}, [this](const HttpRequest&) { return Health(); }});
  if (responses_ != nullptr) {
    for (HttpRoute& r : ResponsesRoutes(env_, &served_model_, responses_)) {
      routes.push_back(std::move(r));
    }
  }
  return routes;
}

}  // namespace specula
