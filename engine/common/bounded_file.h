#pragma once

// Reading a whole file the server was pointed at (a config, a token list, a template, a
// certificate, a model's JSON metadata) without trusting what the path names: a device such as
// /dev/zero, a FIFO or a socket would be read without end, and a huge file would fill memory.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specula {

// The file's bytes if `path` names a regular file of at most `max_bytes`, read to the end.
// Errors name `what` (the config key or file role) and the path:
//   NOT_FOUND          the path does not exist
//   PERMISSION_DENIED  it may not be read
//   INVALID_ARGUMENT   a directory, a device, FIFO or socket, larger than max_bytes (also when it
//                      grows past it while read), or a read error
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what);

}  // namespace specula
