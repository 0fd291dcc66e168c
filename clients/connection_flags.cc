#include "clients/connection_flags.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/image_io.h"
#include "common/tls_files.h"

ABSL_FLAG(bool, tls, false, "connect over TLS, trusting the system's CAs (implied by any other --tls_* flag)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificates to trust instead of the system's (implies --tls)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a server that requires one (wmserve --tls_client_ca; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (not encrypted)");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is this client's API token (wmserve --auth_tokens); default: the WMSERVE_TOKEN "
          "environment variable, if set");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name the server's certificate must carry (default: the host of --server)");

namespace wm::client {

namespace {

// the API token: --token_file's first line, or WMSERVE_TOKEN (a flag's value
// would show in the process list)
absl::StatusOr<std::string> token_from_flags() {
  // gRPC aborts the process on metadata with other bytes: refused here instead
  auto printable = [](absl::string_view t) {
    return std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7f; });
  };
  const std::string path = absl::GetFlag(FLAGS_token_file);
  if (path.empty()) {
    const char* env = std::getenv("WMSERVE_TOKEN");
    const absl::string_view token = env != nullptr ? absl::StripAsciiWhitespace(env) : "";
    if (!printable(token))
      return absl::InvalidArgumentError("WMSERVE_TOKEN: a token is printable characters without spaces");
    return std::string(token);
  }
  auto text = read_file(path, 64 << 10);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--token_file: ", text.status().message()));
  const absl::string_view first = absl::StripAsciiWhitespace(absl::string_view(*text).substr(0, text->find('\n')));
  if (first.empty()) return absl::InvalidArgumentError(absl::StrCat("--token_file ", path, ": its first line is empty"));
  if (!printable(first))
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file ", path, ": a token is printable characters without spaces"));
  return std::string(first);
}

}  // namespace

absl::Status apply_connection_flags(ChannelOptions* options) {
  auto token = token_from_flags();
  if (!token.ok()) return token.status();
  options->auth_token = std::move(*token);
  const std::string ca = absl::GetFlag(FLAGS_tls_ca), cert = absl::GetFlag(FLAGS_tls_cert),
                    key = absl::GetFlag(FLAGS_tls_key), name = absl::GetFlag(FLAGS_tls_server_name);
  options->tls = absl::GetFlag(FLAGS_tls) || !ca.empty() || !cert.empty() || !key.empty() || !name.empty();
  if (!options->tls) return absl::OkStatus();
  if (cert.empty() != key.empty()) return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  if (!ca.empty()) {
    auto cas = read_certificates(ca, "--tls_ca", CertRole::kTrustedCas);
    if (!cas.ok()) return cas.status();
    options->tls_ca = std::move(*cas);
  }
  if (!cert.empty()) {
    auto pair = read_key_pair(cert, key);
    if (!pair.ok()) return pair.status();
    options->tls_cert = std::move(pair->cert_chain);
    options->tls_key = std::move(pair->private_key);
  }
  options->tls_server_name = name;
  return absl::OkStatus();
}

}  // namespace wm::client
