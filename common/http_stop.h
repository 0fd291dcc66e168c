// Stopping a civetweb server quickly. civetweb's listening thread looks for
// a stop only between its polls for a connection, which wait up to 2 s, so
// stopping an idle server (prometheus-cpp's Exposer in wmserve, the page
// server of wmplay --web) took 1 to 1.5 s. While the stop runs, a
// connection of our own to the listening port every 20 ms wakes that poll.
#pragma once

#include <functional>
#include <string>

namespace wm {

// Runs `stop` (which destroys or closes the civetweb server listening on
// host:port) on another thread, and connects to host:port every 20 ms until
// it returns. An empty host, 0.0.0.0 or an address that does not parse is
// reached on 127.0.0.1; a host name is resolved. A port <= 0 wakes nothing:
// the stop then takes what civetweb takes.
void stop_http_server(const std::function<void()>& stop, const std::string& host, int port);

}  // namespace wm
