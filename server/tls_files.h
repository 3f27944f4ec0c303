// The server's TLS files (server.tls in the config): read, checked and watched for changes.
// Shared by the gRPC listener (which hands the paths to gRPC's own file watcher) and the HTTP
// listener (server/http_tls.h, which reloads from these contents).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace specula {

struct TlsPaths {
  std::string cert_file;       // PEM chain, leaf first
  std::string key_file;        // PEM private key, unencrypted
  std::string client_ca_file;  // PEM CA bundle; "" = client certificates not required
};

struct TlsFileContents {
  std::string cert_chain_pem;
  std::string key_pem;
  std::string client_ca_pem;  // "" without a client CA
};

// Reads the files and checks them with OpenSSL: the chain parses, the key parses and belongs to
// the leaf, the CA bundle holds at least one certificate. INVALID_ARGUMENT (NOT_FOUND for a file
// that cannot be read) naming the config key and the path.
absl::StatusOr<TlsFileContents> LoadTlsFiles(const TlsPaths& paths);

// OpenSSL's reason for its last failure (the last error it queued), its error queue emptied.
std::string OpenSslErrorReason();

// What identifies a file's version without reading it: inode, size and modification time.
// Changes when a file is rewritten or replaced (the rename a certificate manager does).
std::string TlsFilesVersion(const TlsPaths& paths);

}  // namespace specula
