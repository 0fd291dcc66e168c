// Which accepted connections are still open, counted in total and per
// client, for the gRPC port's caps (--max_connections,
// --max_connections_per_client). Once a connection is handed to gRPC, gRPC
// owns its file descriptor and closes it without telling anyone; a
// connection is known by its descriptor and the socket's inode, so a
// descriptor that was closed (EBADF), or reused for anything else (another
// inode), marks its connection gone. sweep() finds them. A client's new
// connections are rationed too (a TLS handshake costs the server a
// signature: a loop of connect and close would burn its cores).
//
// Threading: one thread (the listener's).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "server/clock.h"
#include "server/rate_buckets.h"

namespace wm::server {

struct ConnectionCaps {
  int max_total = 0;       // 0: no cap
  int max_per_client = 0;  // per client_group(address); 0: no cap
  // new connections per client: burst_per_client at once, refilled at
  // rate_per_client a second (0: no limit); each one admitted takes one
  double rate_per_client = 0;
  int burst_per_client = 0;
  // calls (streams) a connection may open in one second; past that it is
  // shut down and its address refused for block_s (0: no limit)
  int max_calls_per_s = 0;
  double block_s = 10;
};

class ConnectionTable {
 public:
  enum class Verdict { kAdmitted, kTotalCap, kClientCap, kClientRate, kClientBlocked, kNotASocket };

  explicit ConnectionTable(ConnectionCaps caps)
      : caps_(caps), rate_(caps.rate_per_client, caps.burst_per_client) {}

  // a new connection `fd` from `client` (a client_group) at `now`: admitted
  // and counted, or refused (and not counted, nor taken from the client's
  // rate: the caller closes it). A cap hit sweeps first, so connections
  // closed since the last sweep make room: the client's own at its cap (at
  // most max_per_client of them), all of them at the total cap but no more
  // often than every 100 ms (a flood at a cap must not fstat every open
  // connection per refusal).
  // `peer` is how gRPC names the connection ("ipv4:1.2.3.4:5678")
  Verdict admit(int fd, const std::string& client, const std::string& peer, TimePoint now);
  // forgets the connections whose descriptor no longer holds their socket
  void sweep();

  // a call on the connection gRPC names `peer`: true (once per connection)
  // when it is past max_calls_per_s calls within one second; then the
  // connection is shut down (both directions of its socket: gRPC sees it
  // end and closes it) and its address refused for block_s. *client: its
  // address
  bool note_call(absl::string_view peer, TimePoint now, std::string* client);

  int open() const { return static_cast<int>(by_fd_.size()); }
  int open_from(absl::string_view client) const;

 private:
  struct Entry {
    ino_t inode = 0;
    dev_t device = 0;
    std::string client;
    std::string peer;
    int64_t window = -1;  // the second its calls are counted in
    int calls = 0;
    bool shut = false;
  };
  bool still_open(int fd, const Entry& e) const;
  void forget(std::map<int, Entry>::iterator it);
  void sweep_client(const std::string& client);

  ConnectionCaps caps_;
  RateBuckets rate_;
  std::map<int, Entry> by_fd_;
  std::map<std::string, std::set<int>, std::less<>> per_client_;  // the open descriptors of each client
  std::optional<TimePoint> last_full_sweep_;                       // by admit, at the total cap
  std::map<std::string, int, std::less<>> fd_by_peer_;
  std::map<std::string, TimePoint, std::less<>> blocked_until_;  // addresses refused for a while
};

}  // namespace wm::server
