// A mark on an absl::Status (a payload under a type URL) that lets a front end tell one cause of
// a status code from the others with the same code, without matching its message.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace specula {

inline absl::Status WithMark(absl::Status status, absl::string_view mark) {
  status.SetPayload(mark, absl::Cord("1"));
  return status;
}

inline bool HasMark(const absl::Status& status, absl::StatusCode code, absl::string_view mark) {
  return status.code() == code && status.GetPayload(mark).has_value();
}

}  // namespace specula
