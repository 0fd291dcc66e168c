// A whole wmserve instance: the engine worker, the encoder pool, the gRPC
// server (WorldModel, health, reflection) and the Prometheus exposer, built
// from typed options (main.cc maps flags onto them) and torn down in order.
//
// Threading: start() and shutdown() from the owner; the rest from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "server/encoder_pool.h"
#include "server/engine_worker.h"
#include "server/listener.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/session_log.h"

namespace wm::server {

// the longest keepalive setting: gRPC takes them in milliseconds, as an int
inline constexpr int kMaxKeepaliveSeconds = 2000000;

struct KeepaliveOptions {
  int time_s = 30;                  // ping an idle connection this often
  int timeout_s = 10;               // and drop it when the ping is not answered this fast
  int min_client_ping_interval_s = 10;  // clients may ping at most this often (then GOAWAY)
};

// TLS on the gRPC port, as PEM text; no certificate: plaintext
struct TlsOptions {
  std::string cert_chain;  // the server's certificate, then any intermediates
  std::string private_key;
  std::string client_ca;   // set: every client must present a certificate this CA signed
  // with reload_s > 0, gRPC reads these files again every reload_s seconds
  // and serves what it finds (a renewed certificate without a restart); the
  // PEM text above is what they held at start-up, checked
  std::string cert_path, key_path, client_ca_path;
  int reload_s = 0;
  bool enabled() const { return !cert_chain.empty(); }
};

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 50051;                 // 0: any free port
  std::string metrics_host = "0.0.0.0";
  int metrics_port = 9464;          // 0: any free port; -1: no exposer
  // set: /metrics answers only HTTP basic auth with a NAME and TOKEN of
  // this table (401 otherwise); null: anyone may scrape
  std::shared_ptr<const TokenTable> metrics_auth;
  int encoder_threads = 2;
  int max_concurrent_streams = 0;   // per connection; 0: gRPC's default
  ConnectionCaps connections;       // on the gRPC port (listener.h)
  // a connection that has not finished its handshake (TLS, and HTTP/2's
  // preface) by then is closed: idle connections cannot pile up for long
  int handshake_timeout_s = 10;
  int64_t max_send_bytes = 16 << 20;
  KeepaliveOptions keepalive;
  TlsOptions tls;
  std::string session_log;          // SessionLog::open's argument; "": no session log
  WorkerConfig worker;
  SessionManagerConfig sessions;    // capacity and reservations come from the engine
  ServiceConfig service;
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> start(ServerOptions options);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  const ServedModel& model() const { return model_; }
  int sessions() const { return service_->sessions(); }  // parked ones included
  std::pair<int, int> sessions_and_parked() const { return service_->sessions_and_parked(); }

  void sweep_idle() { service_->sweep_idle(Clock::now()); }
  // SIGHUP: new API tokens (PlayService::set_tokens: the sessions closed
  // for a revoked token), and the session log's file opened again
  int set_tokens(std::shared_ptr<const TokenTable> tokens) { return service_->set_tokens(std::move(tokens)); }
  // SIGHUP: new /metrics credentials (only when the server started with some)
  void set_metrics_auth(std::shared_ptr<const TokenTable> table);
  absl::Status reopen_session_log() { return session_log_ != nullptr ? session_log_->reopen() : absl::OkStatus(); }
  // refuse new sessions (UNAVAILABLE), health NOT_SERVING, tell the sessions
  void begin_drain(double grace_seconds) { service_->begin_drain(grace_seconds); }
  // ends every session (UNAVAILABLE), stops gRPC (cancelling what is left
  // after `cancel_after`), the engine, the encoders and the exposer
  void shutdown(Duration cancel_after);

 private:
  Server() = default;

  ServerOptions options_;
  ServedModel model_;
  std::unique_ptr<SessionLog> session_log_;  // outlives the worker and the service that write it
  std::unique_ptr<EncoderPool> encoder_;
  std::unique_ptr<EngineWorker> worker_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<PlayService> service_;
  // stopped before grpc_ shuts down, destroyed after it (gRPC's call counter points to it)
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;  // gRPC's side of listener_
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  // read by the exposer's threads for each scrape
  mutable std::mutex metrics_auth_mu_;
  std::shared_ptr<const TokenTable> metrics_auth_;
  int port_ = 0;
  int metrics_port_ = -1;
  bool shut_down_ = false;
};

}  // namespace wm::server
