// What the civetweb HTTP servers (prometheus-cpp's Exposer in wmserve, the
// page server of wmplay --web) need around them: a host checked before
// civetweb reads it, and a quick stop.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace wm {

// An IPv4 host for a civetweb server to listen on, checked as typed:
// civetweb takes an address's four numbers unchecked and shifts them into
// place, so 256.0.0.0 bound every interface and 127.0.0.256 bound 127.0.1.0
// while the typed address was printed. A host that starts with a digit must
// be four decimal numbers 0..255; anything else must be a host name
// (letters, digits, '-', '.'), which civetweb resolves. `what` names the
// flag in the message. IPv6 is the caller's to handle.
absl::Status check_http_host(const std::string& host, absl::string_view what);

// Runs `stop` (which destroys or closes the civetweb server listening on
// host:port) on another thread, and connects to host:port every 20 ms until
// it returns: civetweb's listening thread looks for a stop only between its
// polls for a connection, which wait up to 2 s, so stopping an idle server
// took 1 to 1.5 s; each connection wakes that poll. An empty host, 0.0.0.0 or an address that does not parse is
// reached on 127.0.0.1; a host name is resolved. A port <= 0 wakes nothing:
// the stop then takes what civetweb takes.
void stop_http_server(const std::function<void()>& stop, const std::string& host, int port);

}  // namespace wm
