// The specula.v1.Specula service on gRPC's callback API. Every method is registered raw: it parses
// the request bytes itself (server/request_parse.h) so a malformed request gets INVALID_ARGUMENT
// naming the field. Generate streams through a GenerateCall; the unary methods answer inline,
// except that a long text is tokenized on the tokenizer queue, off gRPC's threads, and the session
// methods, which wait for the engine thread's next step boundary, run there too.
#pragma once

#include "server/generate_call.h"
#include "specula/v1/specula.grpc.pb.h"

namespace specula {

using RawSpeculaService = v1::Specula::WithRawCallbackMethod_Generate<
    v1::Specula::WithRawCallbackMethod_Tokenize<v1::Specula::WithRawCallbackMethod_Detokenize<
        v1::Specula::WithRawCallbackMethod_GetModelInfo<
            v1::Specula::WithRawCallbackMethod_ListSessions<
                v1::Specula::WithRawCallbackMethod_DeleteSession<v1::Specula::Service>>>>>>;

class SpeculaService final : public RawSpeculaService {
 public:
  // `env` and `model_info` outlive the service.
  SpeculaService(CallEnv* env, v1::ModelInfo model_info)
      : env_(env), model_info_(std::move(model_info)) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  CallEnv* const env_;
  const v1::ModelInfo model_info_;
};

}  // namespace specula
