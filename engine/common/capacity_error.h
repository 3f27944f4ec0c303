// "This request is larger than the server can ever hold" (prompt + max_tokens beyond the KV
// cache or the host store): RESOURCE_EXHAUSTED, as issue 12 asks, but marked so a front end can
// tell it from "full right now, retry later" (the OpenAI API answers it 400, like a prompt past
// the context, so clients do not retry it).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_mark.h"

namespace specula {

inline constexpr absl::string_view kNeverFitsPayload = "specula/never-fits";

inline absl::Status NeverFitsError(absl::string_view message) {
  return WithMark(absl::ResourceExhaustedError(message), kNeverFitsPayload);
}

inline bool IsNeverFits(const absl::Status& status) {
  return HasMark(status, absl::StatusCode::kResourceExhausted, kNeverFitsPayload);
}

}  // namespace specula
