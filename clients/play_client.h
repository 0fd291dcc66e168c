// The C++ client library of wmserve.v1: a channel with the documented
// keepalive and size settings, a Play stream, and play(), which runs one
// scripted session and measures it on the client's own clock. wmplay,
// wmbench and the integration tests use it.
//
// Threading: a PlayStream may be read by one thread while another writes;
// play() runs its own reader thread and is safe to call from many threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/action.h"
#include "grpcpp/grpcpp.h"
#include "wmserve/v1/wmserve.grpc.pb.h"

namespace wm::client {

struct ChannelOptions {
  int max_receive_bytes = 64 << 20;
  int keepalive_time_s = 20;       // at or above the server's minimum ping interval (10 s)
  int keepalive_timeout_s = 10;
  // a separate connection per channel (so that N benchmark sessions are N TCP connections)
  bool own_connection = false;
  // TLS (PEM text): the CAs to trust (empty: the system's), a client
  // certificate and key for servers that require one, and the name the
  // server's certificate must carry (empty: the target's host)
  bool tls = false;
  std::string tls_ca = "";
  std::string tls_cert = "", tls_key = "";
  std::string tls_server_name = "";
  // API token: sent as 'authorization: Bearer TOKEN' with every call ("": none)
  std::string auth_token = "";
};
std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ChannelOptions& options = {});
// a target's port, when it ends in one (host:port, [v6]:port), is 1..65535:
// gRPC would take 65586 as 50 and -1 as 65535
absl::Status check_server_address(const std::string& target);
// a first call's failure, for a person: "cannot reach wmserve at T: ..."
// when the server was not reached, "wmserve at T refused the call (CODE): ..."
// when it answered (a missing API token, say)
std::string describe_call_failure(const std::string& target, const grpc::Status& status);
// a client's fixed rate: the server's whole range (its --max_fps may allow less)
inline bool fps_in_range(double fps) { return fps >= 0.001 && fps <= 1000; }
// a session's timeout becomes int64 microseconds: a week is far inside, NaN and 1e300 are not
inline bool timeout_in_range(double seconds) { return seconds > 0 && seconds <= 7 * 86400; }

// one Play stream, thin over the synchronous API
class PlayStream {
 public:
  explicit PlayStream(const std::shared_ptr<grpc::Channel>& channel,
                      std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max());
  ~PlayStream();

  // sends Start and waits for Started; the error status of the stream otherwise
  grpc::Status start(const wmserve::v1::Start& start);
  const wmserve::v1::Started& started() const { return started_; }
  bool send_action(const wmserve::v1::Action& action);
  bool send(const wmserve::v1::PlayRequest& request);
  // the next Frame or Event; false at the end of the stream (then call finish)
  bool read(wmserve::v1::PlayResponse* response);
  void writes_done();
  grpc::Status finish();
  bool finished() const { return finished_; }
  void cancel() { context_.TryCancel(); }
  grpc::ClientContext& context() { return context_; }

 private:
  std::unique_ptr<wmserve::v1::WorldModel::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<wmserve::v1::PlayRequest, wmserve::v1::PlayResponse>> stream_;
  wmserve::v1::Started started_;
  std::mutex write_mu_;
  bool writes_done_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

// grpc.health.v1 Check of `service` ("" = the server; "wmserve.v1.admit" =
// admitting new sessions): 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN, 0
// UNKNOWN; the call's error status if it fails
struct HealthResult {
  grpc::Status status;
  int serving_status = 0;
  bool serving() const { return status.ok() && serving_status == 1; }
};
HealthResult health_check(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                          std::chrono::milliseconds timeout = std::chrono::seconds(5));

wmserve::v1::Action to_proto(const Action& a, uint64_t seq, int64_t client_time_us);
// the client's monotonic clock in microseconds
int64_t now_us();
// "RESOURCE_EXHAUSTED" for grpc::StatusCode::RESOURCE_EXHAUSTED
const char* status_code_name(grpc::StatusCode code);

struct PlayConfig {
  wmserve::v1::Start start;
  std::vector<Action> actions;   // one per step of the script (seq = position + 1)
  // how actions are sent: > 0, at this rate (a live player); 0, in lockstep,
  // at most `window` actions ahead of the last acknowledged one (and no more
  // than Started.action_queue_capacity: the server refuses what it cannot queue)
  double send_fps = 0;
  int window = 1;
  // wait this long after Started before the first action (a live player's
  // actions have no fixed phase against the server's ticks)
  double start_delay_s = 0;
  bool keep_jpeg = true;         // keep every frame's JPEG in the result
  double timeout_s = 300;        // the whole session
  // after the last action is acknowledged, go on reading this long before
  // half-closing (fixed-rate pacing keeps sending frames)
  double linger_s = 0;
  // called on the reader thread for every frame
  std::function<void(const wmserve::v1::Frame&)> on_frame;
  // test hook: stall the reader for this long after the first frame (slow client)
  double reader_stall_s = 0;
};

struct FrameRecord {
  int64_t index = 0;
  uint64_t last_action_seq = 0;
  int64_t received_us = 0;       // client clock
  wmserve::v1::Timings timings;
  int64_t kv_cache_bytes = 0;
  uint64_t frames_dropped = 0;   // the server's count for this session
  bool deadline_missed = false;
  std::string jpeg;              // when kept
};

struct PlayResult {
  grpc::Status status;
  wmserve::v1::Started started;
  std::vector<FrameRecord> frames;
  std::vector<wmserve::v1::Event> events;
  std::vector<double> action_to_frame_s;   // per acknowledged action, client clock
  uint64_t actions_sent = 0;
  uint64_t last_acked_seq = 0;
  double wall_s = 0;
  std::vector<double> intervals_s() const;  // between consecutive frames
};

// plays one session; never throws; the status says how the stream ended
PlayResult play(const std::shared_ptr<grpc::Channel>& channel, const PlayConfig& config);

}  // namespace wm::client
