// Requests arrive as raw bytes (the service's methods are registered raw) and are parsed here, so
// that a bad request gets a useful answer. gRPC's own parsing answers any failure with an empty
// UNIMPLEMENTED (callback API), logs libprotobuf's line, and never reaches our metrics.
#pragma once

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace specula {

// Parses `bytes` into `out`. INVALID_ARGUMENT naming the field when a string field holds invalid
// UTF-8 ("stopping.stop[1]: invalid UTF-8 at byte 3 ..."), or saying the bytes are no
// `out`-typed message at all.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* out);

// Serializes `message` into `out` for a raw method's response.
absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// Routes libprotobuf's own log lines into specula's logger (at debug level: every failure they
// describe is answered and logged by the server itself). Call once at startup.
void RouteProtobufLogs();

}  // namespace specula
