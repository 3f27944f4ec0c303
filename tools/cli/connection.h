// How specula-cli reaches a server (--server): plaintext or TLS (--tls, --ca_file, and for
// mutual TLS --cert_file and --key_file), with the bearer token of --token_file on every call.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace specula {

struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::string authorization;  // "Bearer TOKEN", or "" without --token_file

  // A context with the --timeout deadline and the token; it must outlive its call.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
};

// INVALID_ARGUMENT naming the flag when a file cannot be read, holds no token, or the TLS flags
// do not go together (a certificate without its key).
absl::StatusOr<Connection> Connect();

}  // namespace specula
