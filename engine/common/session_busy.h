// "This session has a request queued or running" (docs/SESSIONS.md): FAILED_PRECONDITION, as gRPC
// clients know it, marked so the OpenAI API can answer it 409 Conflict (a state of the server the
// client can wait out) rather than 400 (a request that is wrong whenever it is sent).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_mark.h"

namespace specula {

inline constexpr absl::string_view kSessionBusyPayload = "specula/session-busy";

inline absl::Status SessionBusyError(absl::string_view message) {
  return WithMark(absl::FailedPreconditionError(message), kSessionBusyPayload);
}

inline bool IsSessionBusy(const absl::Status& status) {
  return HasMark(status, absl::StatusCode::kFailedPrecondition, kSessionBusyPayload);
}

}  // namespace specula
