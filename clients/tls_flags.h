// The clients' --tls, --tls_ca, --tls_cert, --tls_key and --tls_server_name
// flags (wmplay, wmbench, wmhealth): defined once, read into ChannelOptions
// with their files checked (common/tls_files.h).
#pragma once

#include "absl/status/status.h"
#include "clients/play_client.h"

namespace wm::client {

// fills the TLS fields of *options from the flags; an error names the flag
absl::Status apply_tls_flags(ChannelOptions* options);

}  // namespace wm::client
