#include "tools/cli/connection.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/cli/cli_flags.h"

namespace specula {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

// The first token of a server.auth.token_file-style file: its first line that is neither blank
// nor a # comment.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFlagFile("token_file", path);
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line[0] != '#') return std::string(line);
  }
  return absl::InvalidArgumentError(absl::StrCat("--token_file: '", path, "' holds no token"));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials() {
  const std::string ca = absl::GetFlag(FLAGS_ca_file), cert = absl::GetFlag(FLAGS_cert_file),
                    key = absl::GetFlag(FLAGS_key_file);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--cert_file and --key_file go together");
  }
  if (!absl::GetFlag(FLAGS_tls) && ca.empty() && cert.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;  // empty roots: the system's CA store
  for (auto [flag, path, out] : {std::tuple{"ca_file", ca, &options.pem_root_certs},
                                 std::tuple{"cert_file", cert, &options.pem_cert_chain},
                                 std::tuple{"key_file", key, &options.pem_private_key}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadFlagFile(flag, path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return grpc::SslCredentials(options);
}

}  // namespace

std::unique_ptr<grpc::ClientContext> Connection::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  const double timeout_s = absl::GetFlag(FLAGS_timeout);
  if (timeout_s > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          std::chrono::duration<double>(timeout_s)));
  }
  if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
  return ctx;
}

absl::StatusOr<Connection> Connect() {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = Credentials();
  if (!credentials.ok()) return credentials.status();
  Connection c;
  c.channel = grpc::CreateChannel(absl::GetFlag(FLAGS_server), *credentials);
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadToken(path);
    if (!token.ok()) return token.status();
    c.authorization = absl::StrCat("Bearer ", *token);
  }
  return c;
}

}  // namespace specula
