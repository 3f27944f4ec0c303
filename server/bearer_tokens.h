// Bearer-token authentication (server.auth.token_file): the tokens a client may present as
// `authorization: Bearer TOKEN` (gRPC metadata or HTTP header). Checked in constant time per
// token, so the time taken does not tell how much of a guess was right; reloaded on SIGHUP.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specula {

// The token of an `authorization` value "Bearer TOKEN" (the scheme case-insensitive, the token
// without surrounding whitespace); nullopt for any other scheme or an empty token.
std::optional<absl::string_view> BearerTokenOf(absl::string_view authorization);

class BearerTokens {
 public:
  // Reads `path`: one token per line (blank lines and lines starting with # ignored), each 16 to
  // 4096 printable ASCII characters without spaces. INVALID_ARGUMENT naming server.auth.token_file
  // and the line for a bad token or a file with none; NOT_FOUND when it cannot be read.
  static absl::StatusOr<std::unique_ptr<BearerTokens>> Load(const std::string& path);

  // Whether `authorization` ("Bearer TOKEN", the scheme case-insensitive) names a token. Any
  // thread.
  bool Allows(absl::string_view authorization) const;

  // Reads the file again; on an error the tokens in use stay. Any thread.
  absl::Status Reload();

  size_t size() const;

 private:
  explicit BearerTokens(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::vector<std::string>> Read(const std::string& path);

  const std::string path_;
  mutable std::mutex mu_;
  std::vector<std::string> tokens_;  // guarded by mu_
};

// The 401/UNAUTHENTICATED message for a missing or wrong token.
inline constexpr char kUnauthenticatedMessage[] =
    "missing or invalid bearer token (authorization: Bearer TOKEN; server.auth.token_file)";

}  // namespace specula
