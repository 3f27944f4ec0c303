// The socket address a listener binds for "HOST:PORT" (the HTTP API's, /metrics', and the plaintext
// gRPC listener's).
#pragma once

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"

namespace specula {

// ParseHostPort-checked; names are resolved (the first address). UNAVAILABLE when the name does
// not resolve.
absl::StatusOr<sockaddr_storage> ResolveListenAddress(const std::string& host_port);
// The length bind() takes for `addr`'s family.
socklen_t AddressLength(const sockaddr_storage& addr);

}  // namespace specula
