#include "server/tls_files.h"

#include <gnutls/gnutls.h>
#include <sys/stat.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "engine/common/bounded_file.h"
#include "server/gnutls_datum.h"

namespace specula {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;  // far beyond any certificate chain or CA bundle

absl::StatusOr<std::string> ReadPem(const char* key, const std::string& path) {
  return ReadBoundedFile(path, kMaxPemBytes, key);
}

// The chain and key load together (GnuTLS checks that the key belongs to the leaf).
absl::Status CheckIdentity(const TlsPaths& paths, const TlsFileContents& c) {
  gnutls_certificate_credentials_t cred = nullptr;
  if (gnutls_certificate_allocate_credentials(&cred) < 0) {
    return absl::ResourceExhaustedError("server.tls: cannot allocate TLS credentials");
  }
  absl::Cleanup free_cred = [cred] { gnutls_certificate_free_credentials(cred); };
  const gnutls_datum_t cert = GnutlsDatum(c.cert_chain_pem), key = GnutlsDatum(c.key_pem);
  const int r = gnutls_certificate_set_x509_key_mem2(cred, &cert, &key, GNUTLS_X509_FMT_PEM,
                                                     nullptr, 0);
  if (r == GNUTLS_E_CERTIFICATE_KEY_MISMATCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.tls.key_file: '", paths.key_file,
                     "' is not the key of the certificate in '", paths.cert_file, "'"));
  }
  if (r < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.tls.cert_file / server.tls.key_file: '", paths.cert_file, "' and '",
        paths.key_file, "' are not a PEM certificate chain and its unencrypted private key: ",
        gnutls_strerror(r)));
  }
  return absl::OkStatus();
}

absl::Status CheckClientCa(const TlsPaths& paths, const TlsFileContents& c) {
  gnutls_certificate_credentials_t cred = nullptr;
  if (gnutls_certificate_allocate_credentials(&cred) < 0) {
    return absl::ResourceExhaustedError("server.tls: cannot allocate TLS credentials");
  }
  absl::Cleanup free_cred = [cred] { gnutls_certificate_free_credentials(cred); };
  const gnutls_datum_t ca = GnutlsDatum(c.client_ca_pem);
  const int n = gnutls_certificate_set_x509_trust_mem(cred, &ca, GNUTLS_X509_FMT_PEM);
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.tls.client_ca_file: '", paths.client_ca_file,
                     "' holds no PEM certificate", n < 0 ? absl::StrCat(": ", gnutls_strerror(n))
                                                          : std::string()));
  }
  return absl::OkStatus();
}

std::string FileVersion(const std::string& path) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0) return "-";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

}  // namespace

absl::StatusOr<TlsFileContents> LoadTlsFiles(const TlsPaths& paths) {
  TlsFileContents c;
  absl::StatusOr<std::string> pem = ReadPem("server.tls.cert_file", paths.cert_file);
  if (!pem.ok()) return pem.status();
  c.cert_chain_pem = *std::move(pem);
  if (!(pem = ReadPem("server.tls.key_file", paths.key_file)).ok()) return pem.status();
  c.key_pem = *std::move(pem);
  if (absl::Status s = CheckIdentity(paths, c); !s.ok()) return s;
  if (!paths.client_ca_file.empty()) {
    if (!(pem = ReadPem("server.tls.client_ca_file", paths.client_ca_file)).ok()) {
      return pem.status();
    }
    c.client_ca_pem = *std::move(pem);
    if (absl::Status s = CheckClientCa(paths, c); !s.ok()) return s;
  }
  return c;
}

std::string TlsFilesVersion(const TlsPaths& paths) {
  return absl::StrCat(FileVersion(paths.cert_file), "|", FileVersion(paths.key_file), "|",
                      FileVersion(paths.client_ca_file));
}

}  // namespace specula
