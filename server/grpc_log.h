// gRPC's own log lines, rate-limited: gRPC logs a line for every failed TLS
// handshake (and other per-connection failures), which a client can repeat
// thousands of times a second to flood the server's log. At most
// `per_second` lines a second reach stderr; the first line after drops says
// how many were dropped. gRPC's verbosity (GRPC_VERBOSITY) still decides
// what is logged at all.
#pragma once

#include <cstdint>

#include "server/clock.h"

namespace wm::server {

// the budget, as pure code
class LogLimiter {
 public:
  explicit LogLimiter(int per_second) : per_second_(per_second) {}
  // whether a line at `now` may be written; *dropped: how many lines were
  // dropped since the last one written (to be reported before it)
  bool admit(TimePoint now, int64_t* dropped);

 private:
  int per_second_;
  TimePoint window_start_{};
  int in_window_ = 0;
  int64_t dropped_ = 0;
};

// routes gRPC's log through a LogLimiter of per_second lines to stderr
void limit_grpc_log(int per_second);

}  // namespace wm::server
