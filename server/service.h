// The gRPC service wmserve.v1.WorldModel (callback API): Play streams,
// ListModels and GetServerInfo. Handlers never wait for the engine: Play
// admits against the session manager, then hands the session to the engine
// worker and returns; everything else reads fixed or atomic state.
//
// The methods take their messages as bytes and parse them here, so that a
// message that does not parse gets INVALID_ARGUMENT with a reason (gRPC's
// own parsing would end a stream as if the client had half-closed it, and
// a unary call with an empty UNIMPLEMENTED); in a started Play stream such
// a message is dropped with an in-band warning, like an invalid action.
//
// Threading: all methods may be called from any gRPC thread; the session
// manager is guarded by mu_.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>

#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/encoder_pool.h"
#include "server/auth.h"
#include "server/connection_table.h"
#include "server/engine_worker.h"
#include "server/metrics.h"
#include "server/play_protocol.h"
#include "server/served_model.h"
#include "server/session_log.h"
#include "server/session_manager.h"
#include "wmserve/v1/wmserve.grpc.pb.h"

namespace wm::server {

inline constexpr char kAdmitHealthService[] = "wmserve.v1.admit";

struct ServiceConfig {
  std::string version;
  ProtocolLimits limits;
  int64_t max_request_bytes = 4 << 20;
  int event_capacity = 16;
  // fraction of sessions (0..1) audited against a full-precision shadow even
  // when their Start did not ask; spread evenly over admitted sessions
  double audit_fraction = 0.0;
  // a Play stream that sends no Start within this is ended (DEADLINE_EXCEEDED); zero: never
  Duration start_timeout = std::chrono::seconds(10);
  // API tokens: set, every call but the health checks needs one
  std::shared_ptr<const TokenTable> tokens;
  // the gRPC port's limits (the listener applies them; ServerInfo reports them)
  ConnectionCaps connections;
};

// A Play stream still waiting for its Start: sweep_idle ends it past its
// deadline. The reactor clears `finish` when its Start arrives or it is done;
// whoever calls `finish` holds `mu` (recursive: finishing may end the stream
// on the same thread).
struct PendingStart {
  std::recursive_mutex mu;
  std::function<void(const absl::Status&)> finish;
  TimePoint deadline;
};

using RawWorldModelService = wmserve::v1::WorldModel::WithRawCallbackMethod_Play<
    wmserve::v1::WorldModel::WithRawCallbackMethod_ListModels<
        wmserve::v1::WorldModel::WithRawCallbackMethod_GetServerInfo<wmserve::v1::WorldModel::Service>>>;

class PlayService final : public RawWorldModelService {
 public:
  PlayService(ServiceConfig config, const ServedModel& model, SessionManagerConfig manager, EngineWorker* worker,
              EncoderPool* encoder, Metrics* metrics, SessionLog* session_log = nullptr);

  // the gRPC server's health service, once it is built
  void set_health(grpc::HealthCheckServiceInterface* health);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Play(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

  // the engine worker's callback: a session's engine state is gone
  // a session that never opened ends uncounted (it was rejected, or never started)
  void on_session_closed(const std::shared_ptr<ServerSession>& session, EndReason reason, bool opened);
  // closes sessions idle past the TTL and parked past the park TTL; call periodically
  void sweep_idle(TimePoint now);
  // a new Play stream waits for its Start (start_timeout); null when there is no timeout.
  // Past it sweep_idle calls finish with the timeout's DEADLINE_EXCEEDED; finish ends the
  // stream and counts the rejection (start_timeout, or unauthenticated without a known token)
  std::shared_ptr<PendingStart> await_start(TimePoint now, std::function<void(const absl::Status&)> finish);
  // the stream of `session` ended without a purposeful close (cancelled,
  // broken): park the session if allowed, else close it with `status`
  void park_or_close(const std::shared_ptr<ServerSession>& session, const absl::Status& status, EndReason reason);
  // a new stream for the parked session of `token` (counted as a rejection
  // on failure); the caller records it, then calls worker().activate()
  // only_client: as SessionManager::unpark; address: the new stream's
  // client address, which the session reports from now on
  absl::StatusOr<std::shared_ptr<ServerSession>> resume(absl::string_view token, StreamWriter* writer, TimePoint now,
                                                        absl::string_view only_client, const std::string& address);
  // replaces the API tokens (SIGHUP): calls from now on need one of these,
  // and sessions (open or parked) started with a token the new ones lack
  // end now, UNAUTHENTICATED (`revoked`); returns how many
  int set_tokens(std::shared_ptr<const TokenTable> tokens);
  // whether a Caller::credential is still one of the API tokens ("" always is)
  bool still_authorized(const std::string& credential) const;
  // the caller's API token (an empty Caller when the server has no tokens);
  // UNAUTHENTICATED without a known token
  absl::StatusOr<Caller> authenticate(const grpc::CallbackServerContext& context) const;
  // refuse new sessions from now on (UNAVAILABLE), health NOT_SERVING, tell
  // every open session (Event SERVER_DRAINING)
  void begin_drain(double grace_seconds);
  int sessions() const;  // held sessions, parked ones included
  // held sessions and how many of them are parked, read at once
  std::pair<int, int> sessions_and_parked() const;

  // for the Play reactor
  const ServedModel& model() const { return model_; }
  const ServiceConfig& config() const { return config_; }
  EngineWorker& worker() { return *worker_; }
  Metrics& metrics() { return *metrics_; }
  SessionLog* session_log() { return session_log_; }  // null: none
  EncoderPool& encoder() { return *encoder_; }
  // admits a session and gives it a fresh resume token (*token); *audit:
  // in, whether the Start asked for an audit; out, whether the session is
  // audited (asked, or sampled by audit_fraction), its shadow reserved;
  // prompt_frames: the frames written before its first block (the client's
  // prompt-frame bucket pays them); credential: the caller's
  // Caller::credential, UNAUTHENTICATED if a reload has revoked it since
  absl::StatusOr<SessionManager::Key> admit(const std::string& client, const std::string& credential,
                                            const std::string& format, int prompt_frames, bool* audit,
                                            TimePoint now, std::string* token);
  // SessionManager::check_prompt_frames under the service's lock
  absl::Status check_prompt_frames(const std::string& client, int prompt_frames, TimePoint now);
  // SessionManager::charge_prompt_frames under the service's lock
  void charge_prompt_frames(const std::string& client, int prompt_frames, TimePoint now);
  void release(SessionManager::Key key);
  void touch(SessionManager::Key key, TimePoint now);
  std::string new_session_id();

 private:
  void update_health_locked();
  std::string new_resume_token_locked();
  void close_parked(const std::vector<SessionManager::Key>& keys, const absl::Status& status, EndReason reason);

  const ServiceConfig config_;
  const ServedModel& model_;
  EngineWorker* const worker_;
  EncoderPool* const encoder_;
  Metrics* const metrics_;
  SessionLog* const session_log_;

  mutable std::mutex mu_;
  SessionManager manager_;
  grpc::HealthCheckServiceInterface* health_ = nullptr;
  int admitting_ = -1;  // last value given to the health service
  uint64_t id_state_;
  int64_t admitted_ = 0;  // sessions admitted so far (audit sampling)
  std::mutex pending_mu_;
  std::vector<std::shared_ptr<PendingStart>> pending_;  // streams not started yet (pruned by sweep_idle)
  mutable std::mutex tokens_mu_;
  std::shared_ptr<const TokenTable> tokens_;  // the config's, until set_tokens
  std::random_device entropy_;  // the OS's CSPRNG (getrandom / rdrand) for resume tokens
};

}  // namespace wm::server
