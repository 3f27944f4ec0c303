#include "server/http_tls.h"

// Boost 1.74's Asio uses std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <boost/asio/ssl/context.hpp>
// clang-format on
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace specula {
namespace {

namespace ssl = boost::asio::ssl;

// A store holding every certificate of the PEM bundle `pem`; null when it holds none.
x509_store_st* CertificateStore(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return nullptr;
  absl::Cleanup free_bio = [bio] { BIO_free(bio); };
  X509_STORE* store = X509_STORE_new();
  if (store == nullptr) return nullptr;
  // Every certificate of the bundle is a trust anchor, an intermediate CA too (as GnuTLS's trust
  // list had it), not only self-signed roots.
  X509_STORE_set_flags(store, X509_V_FLAG_PARTIAL_CHAIN);
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, cert) == 1) ++added;
    X509_free(cert);
  }
  ERR_clear_error();  // the read that ended the loop queued "no start line"
  if (added == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

// A server context presenting `contents`' chain and key; with a client CA it asks every client
// for a certificate, which CheckClient verifies per request (the handshake accepts any, or none).
absl::StatusOr<std::shared_ptr<ssl::context>> ServerContext(const TlsPaths& paths,
                                                            const TlsFileContents& contents) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  // An encrypted key is refused, never prompted for on a terminal.
  context->set_password_callback(
      [](size_t, ssl::context::password_purpose) { return std::string(); });
  boost::system::error_code ec;
  context->use_certificate_chain(
      boost::asio::buffer(contents.cert_chain_pem.data(), contents.cert_chain_pem.size()), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.tls.cert_file '", paths.cert_file, "': ", ec.message()));
  }
  context->use_private_key(boost::asio::buffer(contents.key_pem.data(), contents.key_pem.size()),
                           ssl::context::pem, ec);
  if (ec || SSL_CTX_check_private_key(context->native_handle()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.tls.key_file '", paths.key_file, "': ", ec ? ec.message() : OpenSslErrorReason()));
  }
  if (!contents.client_ca_pem.empty()) {
    context->set_verify_mode(ssl::verify_peer);
    context->set_verify_callback([](bool, ssl::verify_context&) { return true; });
    // No resumption: a resumed session need not carry the client's chain, which every request
    // is checked against.
    SSL_CTX_set_session_cache_mode(context->native_handle(), SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(context->native_handle(), SSL_OP_NO_TICKET);
  }
  return context;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpTls>> HttpTls::Create(const TlsPaths& paths,
                                                         absl::Duration reload_every) {
  std::unique_ptr<HttpTls> tls(new HttpTls(paths, reload_every));
  const std::string version = TlsFilesVersion(paths);
  absl::StatusOr<TlsFileContents> contents = LoadTlsFiles(paths);
  if (!contents.ok()) return contents.status();
  std::lock_guard lock(tls->mu_);
  if (absl::Status s = tls->InstallLocked(*contents); !s.ok()) return s;
  tls->version_ = version;
  tls->next_check_ = absl::Now() + reload_every;
  return tls;
}

HttpTls::~HttpTls() {
  if (client_ca_ != nullptr) X509_STORE_free(client_ca_);
}

absl::Status HttpTls::InstallLocked(const TlsFileContents& contents) {
  // Tools that rewrite unchanged files (config management, secret agents) change the version but
  // not the contents: nothing to install.
  std::string pem = absl::StrCat(contents.cert_chain_pem, "\n--\n", contents.key_pem, "\n--\n",
                                 contents.client_ca_pem);
  if (context_ != nullptr && pem == installed_pem_) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<ssl::context>> context = ServerContext(paths_, contents);
  if (!context.ok()) return context.status();
  X509_STORE* ca = nullptr;
  if (!contents.client_ca_pem.empty()) {
    ca = CertificateStore(contents.client_ca_pem);
    if (ca == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server.tls.client_ca_file '", paths_.client_ca_file, "' holds no PEM certificate"));
    }
  }
  // Verification runs under mu_, so the old store has no reader left; connections keep the
  // context they were accepted with.
  if (client_ca_ != nullptr) X509_STORE_free(client_ca_);
  client_ca_ = ca;
  context_ = *std::move(context);
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

std::shared_ptr<ssl::context> HttpTls::Context() {
  std::lock_guard lock(mu_);
  MaybeReloadLocked();
  return context_;
}

absl::Status HttpTls::CheckClient(ssl_st* connection) {
  if (!requires_client_certificate()) return absl::OkStatus();
  X509* leaf = connection == nullptr ? nullptr : SSL_get0_peer_certificate(connection);
  if (leaf == nullptr) {
    return absl::PermissionDeniedError(
        "a client certificate is required (server.tls.client_ca_file)");
  }
  // On the server side the peer's chain leaves the leaf out.
  STACK_OF(X509)* intermediates = SSL_get_peer_cert_chain(connection);
  X509_STORE_CTX* verify = X509_STORE_CTX_new();
  if (verify == nullptr) return absl::ResourceExhaustedError("out of memory");
  absl::Cleanup free_verify = [verify] { X509_STORE_CTX_free(verify); };
  std::lock_guard lock(mu_);
  MaybeReloadLocked();
  if (X509_STORE_CTX_init(verify, client_ca_, leaf, intermediates) != 1) {
    return absl::ResourceExhaustedError(OpenSslErrorReason());
  }
  // A client certificate, not a server one presented by a client.
  if (X509_STORE_CTX_set_purpose(verify, X509_PURPOSE_SSL_CLIENT) != 1) {
    return absl::InternalError(OpenSslErrorReason());
  }
  if (X509_verify_cert(verify) != 1) {
    const int why = X509_STORE_CTX_get_error(verify);
    ERR_clear_error();
    return absl::PermissionDeniedError(
        absl::StrCat("the client certificate is not signed by server.tls.client_ca_file: ",
                     X509_verify_cert_error_string(why)));
  }
  return absl::OkStatus();
}

int HttpTls::loads() const {
  std::lock_guard lock(mu_);
  return loads_;
}

}  // namespace specula
