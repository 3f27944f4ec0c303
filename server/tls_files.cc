#include "server/tls_files.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "engine/common/bounded_file.h"

namespace specula {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;  // far beyond any certificate chain or CA bundle

absl::StatusOr<std::string> ReadPem(const char* key, const std::string& path) {
  return ReadBoundedFile(path, kMaxPemBytes, key);
}

// A BIO reading `pem`'s bytes (freed by the caller).
BIO* PemBio(const std::string& pem) {
  return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
}

// OpenSSL's passphrase callback: an encrypted key is refused, never prompted for on a terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

// The chain's leaf and the key parse, and the key belongs to the leaf.
absl::Status CheckIdentity(const TlsPaths& paths, const TlsFileContents& c) {
  BIO* cert_bio = PemBio(c.cert_chain_pem);
  BIO* key_bio = PemBio(c.key_pem);
  absl::Cleanup free_bios = [cert_bio, key_bio] {
    BIO_free(cert_bio);
    BIO_free(key_bio);
  };
  X509* leaf =
      cert_bio == nullptr ? nullptr : PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  EVP_PKEY* key = key_bio == nullptr
                      ? nullptr
                      : PEM_read_bio_PrivateKey(key_bio, nullptr, &NoPassphrase, nullptr);
  absl::Cleanup free_parsed = [leaf, key] {
    X509_free(leaf);
    EVP_PKEY_free(key);
  };
  if (leaf == nullptr || key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.tls.cert_file / server.tls.key_file: '", paths.cert_file, "' and '", paths.key_file,
        "' are not a PEM certificate chain and its unencrypted private key: ",
        OpenSslErrorReason()));
  }
  if (X509_check_private_key(leaf, key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("server.tls.key_file: '", paths.key_file,
                                                   "' is not the key of the certificate in '",
                                                   paths.cert_file, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckClientCa(const TlsPaths& paths, const TlsFileContents& c) {
  BIO* bio = PemBio(c.client_ca_pem);
  absl::Cleanup free_bio = [bio] { BIO_free(bio); };
  X509* first = bio == nullptr ? nullptr : PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  ERR_clear_error();
  if (first == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.tls.client_ca_file: '", paths.client_ca_file, "' holds no PEM certificate"));
  }
  X509_free(first);
  return absl::OkStatus();
}

std::string FileVersion(const std::string& path) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0) return "-";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
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

std::string OpenSslErrorReason() {
  std::string reason = "unknown OpenSSL error";
  while (const unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    reason = buf;
  }
  return reason;
}

std::string TlsFilesVersion(const TlsPaths& paths) {
  return absl::StrCat(FileVersion(paths.cert_file), "|", FileVersion(paths.key_file), "|",
                      FileVersion(paths.client_ca_file));
}

}  // namespace specula
