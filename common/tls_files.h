// TLS certificates and keys read from PEM files and checked with OpenSSL
// before gRPC sees them: gRPC reports a bad certificate or a key that does
// not match only as a failed listen or a failed handshake, with no reason
// the user can act on. Used by wmserve's and the clients' --tls_* flags.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wm {

// what a PEM file of certificates is: a chain whose first certificate is
// this program's own (it must be valid now), or CAs to trust (a bundle may
// hold expired ones; verification skips them)
enum class CertRole { kOwnChain, kTrustedCas };
// the certificates of a PEM file: at least one, every one parses, and with
// kOwnChain the first one valid now; `flag` names the file in messages
absl::StatusOr<std::string> read_certificates(const std::string& path, absl::string_view flag, CertRole role);
// a PEM private key that parses
absl::StatusOr<std::string> read_private_key(const std::string& path, absl::string_view flag);
// whether the key is the private key of the chain's first certificate
absl::Status check_key_matches(const std::string& cert_chain_pem, const std::string& key_pem,
                               absl::string_view cert_flag, absl::string_view key_flag);

// a program's own certificate chain and its key (--tls_cert, --tls_key),
// each read and checked as above, and checked to belong together
struct KeyPair {
  std::string cert_chain;
  std::string private_key;
};
absl::StatusOr<KeyPair> read_key_pair(const std::string& cert_path, const std::string& key_path);

}  // namespace wm
