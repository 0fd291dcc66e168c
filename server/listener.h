// The gRPC port: listening sockets of the server's own, accepted by a thread
// of its own and handed to gRPC (ServerBuilder's external connection
// acceptor), so that the server decides which connections gRPC gets.
//
// - Caps: at most --max_connections connections at once, and at most
//   --max_connections_per_client from one address (an IPv6 one by its /64,
//   client_group), and from one address at most --client_connection_burst
//   at once, then --client_connection_rate a second; past any of them a new
//   connection is closed at once, before its handshake costs anything.
// - File descriptors: gRPC's own acceptor stops for good once an accept
//   fails for want of descriptors; this one counts the failure and tries
//   again 100 ms later.
//
// Threading: start/stop on one thread; the accept thread calls the
// callbacks but shut_down, which note_call's caller calls.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/connection_table.h"

namespace wm::server {

class Listener {
 public:
  struct Callbacks {
    std::function<void(int listener_fd, int fd)> hand_over;  // owns fd from then on
    std::function<void(int open)> open_changed;              // connections open now (after a sweep)
    // a connection closed unhandled: "total_cap", "client_cap",
    // "client_rate" or "no_fds" (an accept that failed for want of file
    // descriptors)
    std::function<void(absl::string_view reason, absl::string_view client)> refused;
    // a connection shut down for its calls (note_call); on a gRPC thread
    std::function<void(absl::string_view peer, absl::string_view client)> shut_down;
  };

  // binds every address `host` resolves to (a name, an IPv4 or an IPv6
  // address, in brackets or not) on `port` (0: a free port, the same on
  // every address); UNAVAILABLE when one is taken or cannot be bound
  static absl::StatusOr<std::unique_ptr<Listener>> bind(const std::string& host, int port, ConnectionCaps caps);
  ~Listener();

  int port() const { return port_; }
  void start(Callbacks callbacks);
  // every call on the port (gRPC's threads; a server interceptor): a
  // connection past ConnectionCaps::max_calls_per_s calls in a second is
  // shut down and its address refused for a while (an HTTP/2 rapid reset
  // opens and cancels streams by the ten thousand, which gRPC 1.51 does not
  // limit)
  void note_call(absl::string_view peer);
  // stops accepting and closes the listening sockets (connections already
  // handed over are gRPC's); idempotent
  void stop();

 private:
  Listener(std::vector<int> fds, int port, ConnectionCaps caps);
  // one try; *port_clash: port 0's pick was taken on a later address
  static absl::StatusOr<std::unique_ptr<Listener>> bind_once(const std::string& host, int port, ConnectionCaps caps,
                                                             bool* port_clash);
  void run();
  void accept_from(int listener_fd);

  std::vector<int> fds_;
  int port_ = 0;
  int wake_fd_ = -1;  // an eventfd: stop() wakes the thread
  std::mutex mu_;     // the table: the accept thread and note_call's gRPC threads
  ConnectionTable table_;
  Callbacks callbacks_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  int last_open_ = -1;
};

// "ipv4:1.2.3.4", "ipv6:[2001:db8::1]" (an IPv4-mapped IPv6 address as
// IPv4), as gRPC writes a peer without its port; with_port: and then
// ":5678", as gRPC writes it
std::string peer_of_sockaddr(const void* addr, size_t len, bool with_port = false);

}  // namespace wm::server
