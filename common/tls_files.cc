#include "common/tls_files.h"

#include <memory>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"
#include "common/image_io.h"

namespace wm {

namespace {

// PEM files of keys and certificates are a few KiB; a CA bundle some 200 KiB
constexpr size_t kMaxPemBytes = 4 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio memory_bio(const std::string& text) { return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

// OpenSSL's reason for the last failure (and its queue emptied)
std::string openssl_reason() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block found";
  const char* r = ERR_reason_error_string(e);
  return r != nullptr ? r : absl::StrCat("OpenSSL error ", e);
}

absl::StatusOr<std::string> read_pem(const std::string& path, absl::string_view flag) {
  auto text = read_file(path, kMaxPemBytes);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  if (text->find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": not a PEM file (no -----BEGIN line)"));
  return text;
}

Cert first_certificate(const std::string& pem) {
  Bio bio = memory_bio(pem);
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

absl::StatusOr<std::string> read_certificates(const std::string& path, absl::string_view flag, CertRole role) {
  auto text = read_pem(path, flag);
  if (!text.ok()) return text.status();
  Bio bio = memory_bio(*text);
  int count = 0;
  ERR_clear_error();
  while (true) {
    Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    ++count;
    if (role == CertRole::kOwnChain && count == 1) {
      if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0)
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": its certificate has expired"));
      if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0)
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": its certificate is not valid yet"));
    }
  }
  // the loop ends at the end of the text (no more PEM blocks) or at a block that does not parse
  const unsigned long e = ERR_peek_last_error();
  const bool at_end = e == 0 || ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
  if (count == 0 && at_end)
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": holds no certificate (a -----BEGIN CERTIFICATE----- block)"));
  if (!at_end)
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": certificate ", count + 1,
                                                   " does not parse (", openssl_reason(), ")"));
  ERR_clear_error();
  return text;
}

absl::StatusOr<std::string> read_private_key(const std::string& path, absl::string_view flag) {
  auto text = read_pem(path, flag);
  if (!text.ok()) return text.status();
  if (text->find("PRIVATE KEY-----") == std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": holds no private key (a -----BEGIN PRIVATE KEY----- block)"));
  Bio bio = memory_bio(*text);
  ERR_clear_error();
  // no passphrase callback: an encrypted key is refused, never prompted for
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (key == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": no private key that parses (",
                                                   openssl_reason(), "; an encrypted key must be decrypted first)"));
  return text;
}

absl::Status check_key_matches(const std::string& cert_chain_pem, const std::string& key_pem,
                               absl::string_view cert_flag, absl::string_view key_flag) {
  ERR_clear_error();
  Cert cert = first_certificate(cert_chain_pem);
  Bio bio = memory_bio(key_pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  const bool match = cert != nullptr && key != nullptr && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match)
    return absl::InvalidArgumentError(
        absl::StrCat(key_flag, " is not the private key of ", cert_flag, "'s (first) certificate"));
  return absl::OkStatus();
}

absl::StatusOr<KeyPair> read_key_pair(const std::string& cert_path, const std::string& key_path) {
  auto chain = read_certificates(cert_path, "--tls_cert", CertRole::kOwnChain);
  if (!chain.ok()) return chain.status();
  auto key = read_private_key(key_path, "--tls_key");
  if (!key.ok()) return key.status();
  if (absl::Status st = check_key_matches(*chain, *key, "--tls_cert", "--tls_key"); !st.ok()) return st;
  return KeyPair{std::move(*chain), std::move(*key)};
}

}  // namespace wm
