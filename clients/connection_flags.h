// How the clients (wmplay, wmbench, wmhealth) reach a server, as flags
// defined once: --tls, --tls_ca, --tls_cert, --tls_key, --tls_server_name
// (files checked as common/tls_files.h does) and --token_file (or the
// WMSERVE_TOKEN environment variable), read into ChannelOptions.
#pragma once

#include "absl/status/status.h"
#include "clients/play_client.h"

namespace wm::client {

// fills the TLS and token fields of *options from the flags; an error names the flag
absl::Status apply_connection_flags(ChannelOptions* options);

}  // namespace wm::client
