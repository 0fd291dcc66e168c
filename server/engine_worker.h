// The engine thread: it alone owns the wm::Engine. gRPC threads hand it
// sessions to open, actions and close requests through one mutex-guarded
// table (they never wait for the engine); it batches one block for every
// session with work into each engine step, with a bounded wait to fill the
// batch (server/pacing.h), and hands the frames to the sessions' output
// paths (server/session.h), which never make it wait either.
//
// A parked session (its stream broke; SessionManager decides whether it may
// park) keeps its engine state and is never stepped until resume() attaches
// a new stream to it. Calls that come from a stream (submit, end_input,
// park, close_stream) name their ServerSession: a stream that is no longer
// the one attached to its key is ignored.
//
// Threading: open/submit/end_input/close/close_all/broadcast_event and the
// getters may be called from any thread; start() and stop() from the owner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "server/action_queue.h"
#include "server/metrics.h"
#include "server/pacing.h"
#include "server/served_model.h"
#include "server/session.h"
#include "server/session_log.h"

namespace wm::server {

struct WorkerConfig {
  EngineOptions engine;
  std::string default_cache_format = "fp16";
  Duration max_batch_wait = std::chrono::milliseconds(2);
  int max_batch = 16;
  int action_queue = 32;  // per-action pacing: queued actions per session at most
};

class EngineWorker {
 public:
  // called on the engine thread when a session's engine state is gone;
  // opened: the engine had opened it (else it never started: a failed open,
  // or closed while waiting for its open)
  using ClosedFn = std::function<void(const std::shared_ptr<ServerSession>&, EndReason, bool opened)>;

  EngineWorker(WorkerConfig config, ClosedFn on_closed);
  ~EngineWorker();

  // starts the thread, builds the engine on it and describes the model
  absl::StatusOr<ServedModel> start();
  // sets where metrics go (before any session opens; the engine thread is
  // already running and publishes gauges once it is set)
  void set_metrics(Metrics* metrics) { metrics_.store(metrics, std::memory_order_release); }
  // where opened sessions are logged (before any session opens; may be null)
  void set_session_log(SessionLog* log) { session_log_.store(log, std::memory_order_release); }

  // a session admitted by the session manager; Started is sent once the
  // engine has opened it (or the stream finishes with the engine's error)
  void open(std::shared_ptr<ServerSession> session);
  // an action for a session (already checked against the action space):
  // INVALID_ARGUMENT for a bad seq, RESOURCE_EXHAUSTED for a full queue
  absl::Status submit(const ServerSession& from, const TimedAction& action);
  // the client half-closed: finish the queued actions (per-action pacing),
  // then end the stream with OK
  void end_input(const ServerSession& from);
  // the stream of `from` broke: detach it and keep the engine state, never
  // stepped; queued actions are dropped. True also when `from` was attached
  // by a resume that was never activated; false (nothing changes) when `from`
  // is not attached, not opened yet, or its session is already ending.
  bool park(const ServerSession& from);
  // close(), if `from` is still attached to its key and not parked
  void close_stream(const ServerSession& from, const absl::Status& status, EndReason reason);
  // the detached session of a parked key (its setup serves the new stream), or null
  std::shared_ptr<ServerSession> parked_session(SessionManager::Key key) const;
  // resume, in two steps so that the stream's owner can record `fresh`
  // before anything is written to it. attach: `fresh` (same key, id and
  // parameters as the parked session) replaces the detached session, which
  // stays parked; false when the key is not parked or is ending.
  bool attach(std::shared_ptr<ServerSession> fresh);
  // sends `fresh` Started (resumed = true) and lets it be stepped again
  void activate(const std::shared_ptr<ServerSession>& fresh);
  // ends the session now: finishes its stream with `status` (if not already)
  // and frees its engine state; idempotent
  void close(SessionManager::Key key, const absl::Status& status, EndReason reason);
  void close_all(const absl::Status& status, EndReason reason);
  void broadcast_event(wmserve::v1::Event::Level level, absl::string_view code, absl::string_view message);
  // closes everything and joins the thread
  void stop();

  int sessions() const { return sessions_.load(); }
  int64_t kv_used_bytes() const { return kv_used_.load(); }
  int64_t steps() const { return steps_.load(); }

 private:
  struct Entry {
    Entry(std::shared_ptr<ServerSession> s, ActionQueue q) : session(std::move(s)), input(std::move(q)) {}
    std::shared_ptr<ServerSession> session;
    ActionQueue input;
    std::optional<FixedRatePacer> pacer;
    SessionId engine_id = 0;
    bool opened = false;
    bool input_closed = false;
    bool close_requested = false;
    bool parked = false;     // no stream: not stepped until resumed
    bool resume_broke = false;  // parked again by its resuming stream before activate()
    EndReason end_reason = EndReason::kClientClosed;
    TimePoint last_deadline_event;
    TimePoint served_until;  // the end of its last step (StepCandidate::served_until)
  };
  struct Planned {
    SessionManager::Key key;
    SessionId engine_id;
    std::shared_ptr<ServerSession> session;
    Block block;
    TimePoint ready_since;
    std::optional<Tick> tick;
  };

  void run(std::promise<absl::StatusOr<ServedModel>>* started);
  void loop();
  void do_open(SessionManager::Key key);
  wmserve::v1::Started started_message(const ServerSession& s) const;
  ActionQueue new_action_queue(const StartParams& p) const;
  void do_step(std::vector<Planned>& planned);
  void publish_gauges(int queued);

  WorkerConfig config_;
  ClosedFn on_closed_;
  Metrics* metrics() const { return metrics_.load(std::memory_order_acquire); }
  std::atomic<Metrics*> metrics_{nullptr};
  std::atomic<SessionLog*> session_log_{nullptr};
  std::unique_ptr<Engine> engine_;   // engine thread only
  ServedModel model_;                // fixed after start()
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<SessionManager::Key, Entry> entries_;
  std::vector<SessionManager::Key> to_open_;
  bool stopping_ = false;

  std::atomic<int> sessions_{0};
  std::atomic<int64_t> kv_used_{0};
  std::atomic<int64_t> steps_{0};
  TimePoint last_drift_publish_;
  int64_t span_checks_different_ = 0;  // the device span coder's differing checks logged so far
  TimePoint engine_free_since_;      // end of the last step (engine thread only)
};

}  // namespace wm::server
