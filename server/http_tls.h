// TLS for the HTTP listener (server.tls), on OpenSSL through Asio: each new connection's
// handshake uses the context current when it was accepted, and the files are checked for changes
// at most every `reload_every` when a connection arrives, so a rotated certificate is served
// without a restart. With a client CA, requests are let through only when the connection's
// client certificate verifies against the current CA bundle.
//
// Why client certificates are checked per request rather than refused in the handshake: a
// request without a valid one gets a 403 that says why (an HTTP client shows it), where a failed
// handshake tells the user nothing; and a CA bundle rotated since the handshake applies at once.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/tls_files.h"

namespace boost::asio::ssl {
class context;
}
struct ssl_st;
struct x509_store_st;

namespace specula {

class HttpTls {
 public:
  // Loads the files (LoadTlsFiles' errors, and OpenSSL's when it cannot use them).
  static absl::StatusOr<std::unique_ptr<HttpTls>> Create(const TlsPaths& paths,
                                                         absl::Duration reload_every);
  ~HttpTls();
  HttpTls(const HttpTls&) = delete;
  HttpTls& operator=(const HttpTls&) = delete;

  bool requires_client_certificate() const { return !paths_.client_ca_file.empty(); }

  // The context for a new connection's handshake: the current certificate, reloaded first when
  // the interval passed and the files changed (an error keeps the old ones, logged).
  std::shared_ptr<boost::asio::ssl::context> Context();

  // OK when no client CA is configured, or the connection's client presented a chain the current
  // CA bundle verifies for client authentication; PERMISSION_DENIED saying why otherwise.
  absl::Status CheckClient(ssl_st* connection);

  // How many times the files were loaded (1 after Create); for tests and logs.
  int loads() const;

 private:
  HttpTls(TlsPaths paths, absl::Duration reload_every)
      : paths_(std::move(paths)), reload_every_(reload_every) {}
  // Makes `contents` current; the caller holds mu_.
  absl::Status InstallLocked(const TlsFileContents& contents);
  // Reloads the files if the interval passed and they changed; keeps the old ones on an error.
  void MaybeReloadLocked();

  const TlsPaths paths_;
  const absl::Duration reload_every_;
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> context_;  // guarded by mu_
  x509_store_st* client_ca_ = nullptr;                  // guarded by mu_; null without a CA
  std::string version_;                                 // guarded by mu_
  std::string installed_pem_;  // the chain, key and CA now in use; guarded by mu_
  absl::Time next_check_;      // guarded by mu_
  int loads_ = 0;              // guarded by mu_
};

}  // namespace specula
