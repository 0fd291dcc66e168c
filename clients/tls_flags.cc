#include "clients/tls_flags.h"

#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "common/tls_files.h"

ABSL_FLAG(bool, tls, false, "connect over TLS, trusting the system's CAs (implied by any other --tls_* flag)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificates to trust instead of the system's (implies --tls)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a server that requires one (wmserve --tls_client_ca; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (not encrypted)");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name the server's certificate must carry (default: the host of --server)");

namespace wm::client {

absl::Status apply_tls_flags(ChannelOptions* options) {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca), cert = absl::GetFlag(FLAGS_tls_cert),
                    key = absl::GetFlag(FLAGS_tls_key), name = absl::GetFlag(FLAGS_tls_server_name);
  options->tls = absl::GetFlag(FLAGS_tls) || !ca.empty() || !cert.empty() || !key.empty() || !name.empty();
  if (!options->tls) return absl::OkStatus();
  if (cert.empty() != key.empty()) return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  if (!ca.empty()) {
    auto cas = read_certificates(ca, "--tls_ca");
    if (!cas.ok()) return cas.status();
    options->tls_ca = std::move(*cas);
  }
  if (!cert.empty()) {
    auto chain = read_certificates(cert, "--tls_cert");
    if (!chain.ok()) return chain.status();
    auto pkey = read_private_key(key, "--tls_key");
    if (!pkey.ok()) return pkey.status();
    if (auto st = check_key_matches(*chain, *pkey, "--tls_cert", "--tls_key"); !st.ok()) return st;
    options->tls_cert = std::move(*chain);
    options->tls_key = std::move(*pkey);
  }
  options->tls_server_name = name;
  return absl::OkStatus();
}

}  // namespace wm::client
