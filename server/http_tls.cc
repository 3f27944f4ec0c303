#include "server/http_tls.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "server/gnutls_datum.h"
#include "engine/common/log.h"

namespace specula {
namespace {

constexpr unsigned kMaxChainLength = 16;

absl::Status GnutlsError(absl::string_view what, int code) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", gnutls_strerror(code)));
}

}  // namespace

HttpTls::Identity::~Identity() {
  for (gnutls_pcert_st& c : chain) gnutls_pcert_deinit(&c);
  if (key != nullptr) gnutls_privkey_deinit(key);
}

absl::StatusOr<std::unique_ptr<HttpTls>> HttpTls::Create(const TlsPaths& paths,
                                                         absl::Duration reload_every) {
  std::unique_ptr<HttpTls> tls(new HttpTls(paths, reload_every));
  const std::string version = TlsFilesVersion(paths);
  absl::StatusOr<TlsFileContents> contents = LoadTlsFiles(paths);
  if (!contents.ok()) return contents.status();
  std::lock_guard lock(tls->mu_);
  if (absl::Status s = tls->InstallLocked(*contents); !s.ok()) return s;
  tls->version_ = version;
  tls->initial_client_ca_pem_ = contents->client_ca_pem;
  tls->next_check_ = absl::Now() + reload_every;
  return tls;
}

HttpTls::~HttpTls() {
  if (client_ca_ != nullptr) gnutls_x509_trust_list_deinit(client_ca_, 1);
}

absl::Status HttpTls::InstallLocked(const TlsFileContents& contents) {
  // Tools that rewrite unchanged files (config management, secret agents) change the version but
  // not the contents: nothing to install, and no identity kept for nothing.
  std::string pem =
      absl::StrCat(contents.cert_chain_pem, "\n--\n", contents.key_pem, "\n--\n",
                   contents.client_ca_pem);
  if (!identities_.empty() && pem == installed_pem_) return absl::OkStatus();
  auto id = std::make_unique<Identity>();
  id->chain.resize(kMaxChainLength);
  unsigned n = kMaxChainLength;
  const gnutls_datum_t chain = GnutlsDatum(contents.cert_chain_pem);
  if (int r = gnutls_pcert_list_import_x509_raw(id->chain.data(), &n, &chain, GNUTLS_X509_FMT_PEM,
                                                0);
      r < 0) {
    id->chain.clear();
    return GnutlsError(absl::StrCat("server.tls.cert_file '", paths_.cert_file, "'"), r);
  }
  id->chain.resize(n);
  const gnutls_datum_t key = GnutlsDatum(contents.key_pem);
  if (int r = gnutls_privkey_init(&id->key); r < 0) return GnutlsError("server.tls", r);
  if (int r = gnutls_privkey_import_x509_raw(id->key, &key, GNUTLS_X509_FMT_PEM, nullptr, 0);
      r < 0) {
    return GnutlsError(absl::StrCat("server.tls.key_file '", paths_.key_file, "'"), r);
  }
  gnutls_x509_trust_list_t ca = nullptr;
  if (!contents.client_ca_pem.empty()) {
    if (int r = gnutls_x509_trust_list_init(&ca, 0); r < 0) return GnutlsError("server.tls", r);
    const gnutls_datum_t pem = GnutlsDatum(contents.client_ca_pem);
    if (int r = gnutls_x509_trust_list_add_trust_mem(ca, &pem, nullptr, GNUTLS_X509_FMT_PEM, 0, 0);
        r <= 0) {
      gnutls_x509_trust_list_deinit(ca, 1);
      return absl::InvalidArgumentError(absl::StrCat(
          "server.tls.client_ca_file '", paths_.client_ca_file, "' holds no PEM certificate"));
    }
  }
  identities_.push_back(std::move(id));
  // Verification runs under mu_, so the old list has no reader left.
  if (client_ca_ != nullptr) gnutls_x509_trust_list_deinit(client_ca_, 1);
  client_ca_ = ca;
  installed_pem_ = std::move(pem);
  ++loads_;
  return absl::OkStatus();
}

void HttpTls::MaybeReloadLocked() {
  const absl::Time now = absl::Now();
  if (now < next_check_) return;
  next_check_ = now + reload_every_;
  const std::string version = TlsFilesVersion(paths_);
  if (version == version_) return;
  // A file rewritten in place may be caught half written: it then fails to load and the next
  // check (its version changed again) picks it up whole.
  version_ = version;
  absl::StatusOr<TlsFileContents> contents = LoadTlsFiles(paths_);
  absl::Status s = contents.ok() ? InstallLocked(*contents) : contents.status();
  if (!s.ok()) {
    Log(LogLevel::kWarning, "tls_reload_failed", {{"listener", "http"}, {"error", s.message()}});
    return;
  }
  Log(LogLevel::kInfo, "tls_reloaded", {{"listener", "http"}, {"cert_file", paths_.cert_file}});
}

// libmicrohttpd sets the session pointer to its connection for its pre-shared-key callback only,
// which specula does not use; the certificate callback needs this object instead.
void HttpTls::Attach(gnutls_session_t session) { gnutls_session_set_ptr(session, this); }

int HttpTls::RetrieveCertificate(gnutls_session_t session, const gnutls_datum_t*, int,
                                 const gnutls_pk_algorithm_t*, int, gnutls_pcert_st** pcert,
                                 unsigned int* pcert_length, gnutls_privkey_t* privkey) {
  auto* self = static_cast<HttpTls*>(gnutls_session_get_ptr(session));
  if (self == nullptr) return -1;  // not attached: refuse the handshake rather than guess
  std::lock_guard lock(self->mu_);
  self->MaybeReloadLocked();
  Identity& id = *self->identities_.back();
  *pcert = id.chain.data();
  *pcert_length = static_cast<unsigned>(id.chain.size());
  *privkey = id.key;
  return 0;
}

absl::Status HttpTls::CheckClient(gnutls_session_t session) {
  if (!requires_client_certificate()) return absl::OkStatus();
  unsigned n = 0;
  const gnutls_datum_t* peers = session == nullptr ? nullptr : gnutls_certificate_get_peers(session, &n);
  if (peers == nullptr || n == 0) {
    return absl::PermissionDeniedError(
        "a client certificate is required (server.tls.client_ca_file)");
  }
  std::vector<gnutls_x509_crt_t> chain;
  absl::Cleanup free_chain = [&chain] {
    for (gnutls_x509_crt_t c : chain) gnutls_x509_crt_deinit(c);
  };
  for (unsigned i = 0; i < n; ++i) {
    gnutls_x509_crt_t c = nullptr;
    if (gnutls_x509_crt_init(&c) < 0) return absl::ResourceExhaustedError("out of memory");
    chain.push_back(c);
    if (gnutls_x509_crt_import(c, &peers[i], GNUTLS_X509_FMT_DER) < 0) {
      return absl::PermissionDeniedError("the client certificate does not parse");
    }
  }
  // A client certificate, not a server one presented by a client.
  gnutls_typed_vdata_st purpose{GNUTLS_DT_KEY_PURPOSE_OID,
                                reinterpret_cast<unsigned char*>(const_cast<char*>(
                                    GNUTLS_KP_TLS_WWW_CLIENT)),
                                0};
  unsigned status = 0;
  std::lock_guard lock(mu_);
  MaybeReloadLocked();
  if (int r = gnutls_x509_trust_list_verify_crt2(client_ca_, chain.data(), n, &purpose, 1, 0,
                                                 &status, nullptr);
      r < 0 || status != 0) {
    gnutls_datum_t why{};
    std::string reason = r < 0 ? gnutls_strerror(r) : "not verified";
    if (r >= 0 && gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why,
                                                               0) == 0) {
      reason.assign(reinterpret_cast<char*>(why.data), why.size);
      gnutls_free(why.data);
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "the client certificate is not signed by server.tls.client_ca_file: ", reason));
  }
  return absl::OkStatus();
}

int HttpTls::loads() const {
  std::lock_guard lock(mu_);
  return loads_;
}

}  // namespace specula
