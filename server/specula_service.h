// The specula.v1.Specula service on gRPC's callback API. Generate streams through a GenerateCall;
// the unary methods answer inline (tokenizing is CPU work, no waiting).
#pragma once

#include "server/generate_call.h"
#include "specula/v1/specula.grpc.pb.h"

namespace specula {

class SpeculaService final : public v1::Specula::CallbackService {
 public:
  // `env` and `model_info` outlive the service.
  SpeculaService(CallEnv* env, v1::ModelInfo model_info)
      : env_(env), model_info_(std::move(model_info)) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  CallEnv* const env_;
  const v1::ModelInfo model_info_;
};

}  // namespace specula
