#include "server/specula_service.h"

#include <limits>

#include "absl/strings/str_format.h"
#include "server/status.h"

namespace specula {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* SpeculaService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  return GenerateCall::Start(ctx, request, env_);
}

grpc::ServerUnaryReactor* SpeculaService::Tokenize(grpc::CallbackServerContext* ctx,
                                                   const v1::TokenizeRequest* request,
                                                   v1::TokenizeResponse* response) {
  if (absl::Status s = CheckAdmission(*env_, *request); !s.ok()) return Answer(ctx, s);
  const Tokenizer& tokenizer = env_->engine->generator().tokenizer();
  const bool add_special = !request->has_add_special_tokens() || request->add_special_tokens();
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(request->text(), add_special);
  if (!ids.ok()) {
    return Answer(ctx, absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message())));
  }
  for (int32_t id : *ids) {
    response->add_token_ids(static_cast<uint32_t>(id));
    response->add_tokens(tokenizer.IdToToken(id));
  }
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* SpeculaService::Detokenize(grpc::CallbackServerContext* ctx,
                                                     const v1::DetokenizeRequest* request,
                                                     v1::DetokenizeResponse* response) {
  if (absl::Status s = CheckAdmission(*env_, *request); !s.ok()) return Answer(ctx, s);
  const Tokenizer& tokenizer = env_->engine->generator().tokenizer();
  std::vector<int32_t> ids;
  ids.reserve(request->token_ids_size());
  for (int i = 0; i < request->token_ids_size(); ++i) {
    const uint32_t id = request->token_ids(i);
    if (id >= static_cast<uint64_t>(tokenizer.vocab_size())) {
      return Answer(ctx, absl::InvalidArgumentError(absl::StrFormat(
                             "token_ids[%d] = %d is outside the vocabulary [0, %d)", i, id,
                             tokenizer.vocab_size())));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  absl::StatusOr<std::string> text = tokenizer.Decode(ids, request->skip_special_tokens());
  if (!text.ok()) {
    return Answer(ctx,
                  absl::InvalidArgumentError(absl::StrCat("token_ids: ", text.status().message())));
  }
  response->set_text(*std::move(text));
  return Answer(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* SpeculaService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                       const v1::GetModelInfoRequest* request,
                                                       v1::ModelInfo* response) {
  if (absl::Status s = CheckAdmission(*env_, *request); !s.ok()) return Answer(ctx, s);
  *response = model_info_;
  return Answer(ctx, absl::OkStatus());
}

}  // namespace specula
