// One Play stream's server-side session: its fixed parameters and its
// output path to the network.
//
// Output path: the engine thread hands over frames (raw RGB) and never
// waits; an encoder thread turns the oldest unsent frame into JPEG only when
// the stream can take it; at most one write is in flight. While a write is
// in flight newer frames wait in a bounded outbox (2B - 1 frames for B frames
// per block: the rest of the block being written and one newer block) and
// push out older unsent ones, counted as
// wm_frames_dropped_total{reason="slow_client"}.
//
// Threading: every public method may be called from any thread (engine,
// encoder, gRPC). The stream writer (the reactor) is used only while
// finish() has not reached it: after its finish() it is never touched again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/engine.h"
#include "server/clock.h"
#include "server/encoder_pool.h"
#include "server/metrics.h"
#include "server/outbox.h"
#include "server/play_protocol.h"
#include "server/session_manager.h"
#include "wmserve/v1/wmserve.pb.h"

namespace wm::server {

// what the session writes to: the gRPC reactor (or a test double)
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // one at a time; msg stays valid until on_write_done()
  virtual void start_write(const wmserve::v1::PlayResponse* msg) = 0;
  // once, with no write in flight
  virtual void finish(const absl::Status& status) = 0;
};

// a generated frame on its way to the client
struct OutFrame {
  Frame frame;                 // index, action_seq, rgb
  int64_t client_time_us = 0;  // of the frame's action
  TimePoint arrival;           // of the frame's action
  bool fresh = false;          // first frame applying its action
  int64_t queue_us = 0;
  int64_t model_us = 0;
  int32_t batch_size = 0;
  int64_t kv_cache_bytes = 0;
  bool deadline_missed = false;
};

struct OutItem {
  wmserve::v1::PlayResponse message;   // Started, Event
  std::unique_ptr<OutFrame> frame;     // or a frame still to encode
};

struct SessionSetup {
  std::string id;                // public session id
  SessionManager::Key key = 0;   // server-internal key
  std::string client;            // peer address without port
  std::string user;              // the API token's name ("" without --auth_tokens)
  StartParams params;
  std::string resume_token;      // "" = not resumable
  TimePoint started;             // when Start arrived
  int frame_capacity = 1;        // frames the outbox holds (2B - 1)
  int event_capacity = 16;
};

class ServerSession : public std::enable_shared_from_this<ServerSession> {
 public:
  ServerSession(SessionSetup setup, StreamWriter* writer, EncoderPool* encoder, Metrics* metrics);

  const std::string& id() const { return setup_.id; }
  SessionManager::Key key() const { return setup_.key; }
  const StartParams& params() const { return setup_.params; }
  const std::string& client() const { return setup_.client; }
  TimePoint started() const { return setup_.started; }
  const std::string& resume_token() const { return setup_.resume_token; }
  const SessionSetup& setup() const { return setup_; }

  void send_started(wmserve::v1::Started started);
  void send_event(wmserve::v1::Event::Level level, absl::string_view code, absl::string_view message,
                  uint64_t action_seq = 0);
  void send_frames(std::vector<OutFrame> frames);
  // ends the stream with `status`: with flush, after what is queued has been
  // written; otherwise now (unsent frames are dropped). The first call wins.
  void finish(const absl::Status& status, bool flush);

  // runs `fn` once the stream has been given its final status, when every
  // frame it got has been counted (at once if that has happened; else on
  // the thread that finishes it, or at the latest when the session is
  // destroyed); one callback, a later one replaces it
  void when_finished(std::function<void()> fn);
  // the reactor's OnDone: the stream is over; `cancelled`: it failed before
  // the client had its status (gRPC's IsCancelled: the client cancelled,
  // the connection broke, or gRPC refused an oversize message)
  void stream_done(bool cancelled);
  // runs `fn(cancelled)` once the stream is over (at once if it is; at the
  // latest when the session is destroyed, `cancelled` then whether a write
  // failed); one callback, a later one replaces it
  void when_stream_done(std::function<void(bool cancelled)> fn);
  ~ServerSession();

  // the reactor's OnWriteDone
  void on_write_done(bool ok);

  bool finishing() const;
  uint64_t frames_dropped() const;
  uint64_t frames_sent() const;
  // what the audit measured of this session (audited sessions only: the
  // engine thread sets it as it closes the session; the session log's end
  // event reads it)
  void set_audit_result(const DriftStats& drift);
  std::optional<DriftStats> audit_result() const;

 private:
  void pump();
  void encode_and_write(std::unique_ptr<OutFrame> frame);
  void on_frame_written(const OutFrame& f, TimePoint now);

  const SessionSetup setup_;
  StreamWriter* const writer_;
  EncoderPool* const encoder_;
  Metrics* const metrics_;

  mutable std::mutex mu_;
  Outbox<OutItem> outbox_;
  bool write_in_flight_ = false;
  bool encoding_ = false;
  bool finish_requested_ = false;
  bool flush_ = false;
  bool finish_called_ = false;
  bool broken_ = false;               // a write failed: the stream is gone
  // Started is queued: until then nothing is written (an event about an
  // action sent right after the Start waits for it; API.md: Started first)
  bool started_queued_ = false;
  absl::Status finish_status_;
  wmserve::v1::PlayResponse writing_;  // the message in flight
  bool writing_frame_ = false;
  uint64_t frames_sent_ = 0;
  std::function<void()> on_finished_;  // when_finished's
  bool stream_done_ = false;
  bool stream_cancelled_ = false;
  std::function<void(bool)> on_stream_done_;  // when_stream_done's
  bool any_frame_written_ = false;
  std::optional<DriftStats> audit_result_;
  TimePoint last_frame_write_;
};

}  // namespace wm::server
