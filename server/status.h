// The one place absl::Status becomes grpc::Status (docs/ARCHITECTURE.md §2), plus stable code names
// for metric labels and log fields.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace specula {

// Codes map 1:1 (absl and gRPC share the canonical numbering); the message is kept. Codes
// outside the canonical range become UNKNOWN so a client never sees a code gRPC lacks.
grpc::Status ToGrpcStatus(const absl::Status& status);

// "OK", "CANCELLED", "INVALID_ARGUMENT", ...: the canonical upper-case names that gRPC tools
// print. Non-canonical codes give "UNKNOWN". The view points to static storage.
absl::string_view StatusCodeName(absl::StatusCode code);

}  // namespace specula
