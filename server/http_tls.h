// TLS for the HTTP listener (server.tls): libmicrohttpd runs the handshakes with GnuTLS and asks
// this class for the server's certificate on each one (MHD_OPTION_HTTPS_CERT_CALLBACK), so a
// rotated certificate is served without a restart. With a client CA, requests are let through
// only when the connection's client certificate verifies against the current CA bundle.
//
// Why check client certificates per request rather than in the handshake: libmicrohttpd can
// only ask for one (GNUTLS_CERT_REQUEST), not require it, and its trust list is fixed at start.
// A request without a valid certificate gets 403 before any route sees it.
//
// Thread-safety: every method may be called from any of the server's polling threads.
#pragma once

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/tls_files.h"

namespace specula {

class HttpTls {
 public:
  // Loads the files (LoadTlsFiles' errors); they are checked for changes at most every
  // `reload_every`, on the next handshake or request after it.
  static absl::StatusOr<std::unique_ptr<HttpTls>> Create(const TlsPaths& paths,
                                                         absl::Duration reload_every);
  ~HttpTls();
  HttpTls(const HttpTls&) = delete;
  HttpTls& operator=(const HttpTls&) = delete;

  bool requires_client_certificate() const { return !paths_.client_ca_file.empty(); }
  // The CA bundle read at start: libmicrohttpd's MHD_OPTION_HTTPS_MEM_TRUST, which makes it ask
  // clients for a certificate. Which CA verifies it is decided per request, after reloads.
  const std::string& initial_client_ca_pem() const { return initial_client_ca_pem_; }

  // Ties a new connection's TLS session to this object (libmicrohttpd's connection-start
  // notification), so RetrieveCertificate can find it.
  void Attach(gnutls_session_t session);
  // gnutls_certificate_retrieve_function2: the current certificate chain and key.
  static int RetrieveCertificate(gnutls_session_t session, const gnutls_datum_t* req_ca_rdn,
                                 int nreqs, const gnutls_pk_algorithm_t* pk_algos,
                                 int pk_algos_length, gnutls_pcert_st** pcert,
                                 unsigned int* pcert_length, gnutls_privkey_t* privkey);
  // OK when no client CA is configured, or the session's client presented a chain the current CA
  // bundle verifies; PERMISSION_DENIED saying why otherwise.
  absl::Status CheckClient(gnutls_session_t session);

  // How many times the files were loaded (1 after Create); for tests and logs.
  int loads() const;

 private:
  // One loaded certificate chain and key. Never freed before the HttpTls: a handshake in flight
  // may still hold the pointers RetrieveCertificate gave it (rotations are rare and small).
  struct Identity {
    std::vector<gnutls_pcert_st> chain;
    gnutls_privkey_t key = nullptr;
    ~Identity();
  };
  HttpTls(TlsPaths paths, absl::Duration reload_every)
      : paths_(std::move(paths)), reload_every_(reload_every) {}
  // Makes `contents` current; the caller holds mu_.
  absl::Status InstallLocked(const TlsFileContents& contents);
  // Reloads the files if the interval passed and they changed; keeps the old ones on an error.
  void MaybeReloadLocked();

  const TlsPaths paths_;
  const absl::Duration reload_every_;
  std::string initial_client_ca_pem_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Identity>> identities_;    // newest last; guarded by mu_
  gnutls_x509_trust_list_t client_ca_ = nullptr;         // guarded by mu_
  std::string version_;                                  // guarded by mu_
  std::string installed_pem_;  // the chain, key and CA now in use; guarded by mu_
  absl::Time next_check_;                                // guarded by mu_
  int loads_ = 0;                                        // guarded by mu_
};

}  // namespace specula
