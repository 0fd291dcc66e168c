// One JSON line per session event, for operators: who played, with what,
// for how long, and how it ended (--session_log). Events: "start" (the
// engine opened the session), "park" (its stream broke; kept for a resume),
// "resume" (re-attached to a new stream), "end", and "dropped" (lines lost
// because the log could not keep up). Refused Starts are not logged
// (wm_sessions_rejected_total counts them).
//
// The events are queued and written by a thread of the log's own: the
// engine thread, which reports starts and ends, never waits for a disk or
// a pipe (a log on a stdout nobody reads would otherwise stop every
// session). The queue holds kMaxQueuedLines; past that lines are dropped and
// counted. Each line goes out in one write(2) with its newline; a line a
// full disk cut short is ended before the next one, so lines never run
// together. A failed write is reported on stderr once and never stops the
// server.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics.h"
#include "server/session.h"

namespace wm::server {

class SessionLog {
 public:
  static constexpr size_t kMaxQueuedLines = 10000;

  // "-": standard output; anything else: a file, created or appended to
  static absl::StatusOr<std::unique_ptr<SessionLog>> open(const std::string& where,
                                                          size_t max_queued = kMaxQueuedLines);
  // writes what is queued (for up to 2 s: a writer stuck on a pipe nobody
  // reads is left behind), then stops
  ~SessionLog();
  SessionLog(const SessionLog&) = delete;
  SessionLog& operator=(const SessionLog&) = delete;

  // a file log opens its path again (SIGHUP: after a rotation renamed it);
  // on failure it keeps writing where it did. Standard output: nothing to do
  absl::Status reopen();

  void started(const ServerSession& s, int64_t kv_reserved_bytes);
  void parked(const ServerSession& s);
  void resumed(const ServerSession& s);
  // frames_sent and frames_dropped are those of its last stream
  void ended(const ServerSession& s, EndReason reason, double seconds);

  // lines dropped so far because the queue was full
  int64_t dropped() const;

  // the writer's state, shared with its thread (which may outlive the log)
  struct State;

 private:
  explicit SessionLog(std::shared_ptr<State> state);
  void enqueue(std::string line);

  std::shared_ptr<State> state_;
  std::thread writer_;
};

}  // namespace wm::server
