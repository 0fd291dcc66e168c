// One JSON line per session event, for operators: who played, with what,
// for how long, and how it ended (--session_log). Events: "start" (the
// engine opened the session), "park" (its stream broke; kept for a resume),
// "resume" (re-attached to a new stream), "end". Refused Starts are not
// logged (wm_sessions_rejected_total counts them), so a flood of refusals
// cannot fill the log.
//
// Thread-safe: each line is written whole and flushed under a mutex. A
// failed write is reported on stderr once and never stops the server.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics.h"
#include "server/session.h"

namespace wm::server {

class SessionLog {
 public:
  // "-": standard output; anything else: a file, created or appended to
  static absl::StatusOr<std::unique_ptr<SessionLog>> open(const std::string& where);
  ~SessionLog();
  // a file log opens its path again (SIGHUP: after a rotation renamed it);
  // on failure it keeps writing where it did. Standard output: nothing to do
  absl::Status reopen();
  SessionLog(const SessionLog&) = delete;
  SessionLog& operator=(const SessionLog&) = delete;

  void started(const ServerSession& s, int64_t kv_reserved_bytes);
  void parked(const ServerSession& s);
  // `client`: the address of the stream it is attached to now
  void resumed(const ServerSession& s, const std::string& client);
  // frames_sent and frames_dropped are those of its last stream
  void ended(const ServerSession& s, EndReason reason, double seconds);

 private:
  SessionLog(std::FILE* out, bool own, std::string path) : out_(out), own_(own), path_(std::move(path)) {}
  void write(const std::string& line);

  std::mutex mu_;
  std::FILE* out_;
  bool own_;
  const std::string path_;
  bool failed_ = false;
};

}  // namespace wm::server
