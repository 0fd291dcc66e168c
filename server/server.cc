#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/http_server.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/server_interceptor.h"

namespace wm::server {

namespace {

// counts every call on the port against its connection (Listener::note_call)
class CallCounter final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounter(Listener* listener) : listener_(listener) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    // gRPC writes the peer as a URI ("ipv6:%5B::1%5D:5678"); the listener as the address reads
    if (info->server_context() != nullptr) listener_->note_call(peer_text(info->server_context()->peer()));
    return nullptr;  // nothing to intercept: counting is all
  }

 private:
  Listener* const listener_;
};

// the metrics endpoint's HTTP threads, and how long one waits for a request:
// civetweb holds a thread per connection until its request is read, so it
// takes this many connections that send nothing, each renewed within the
// timeout, to hold a scrape up
constexpr int kMetricsThreads = 32;
constexpr int kMetricsRequestTimeoutMs = 3000;

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  if (!options.session_log.empty()) {
    auto log = SessionLog::open(options.session_log);
    if (!log.ok()) return log.status();
    s->session_log_ = std::move(*log);
  }
  s->encoder_ = std::make_unique<EncoderPool>(options.encoder_threads);
  Server* self = s.get();
  s->worker_ = std::make_unique<EngineWorker>(
      options.worker, [self](const std::shared_ptr<ServerSession>& session, EndReason reason, bool opened) {
        self->service_->on_session_closed(session, reason, opened);
      });
  auto model = s->worker_->start();
  if (!model.ok()) return model.status();
  s->model_ = std::move(*model);
  s->metrics_ = std::make_unique<Metrics>(s->model_, options.service.version);
  s->worker_->set_metrics(s->metrics_.get());
  s->worker_->set_session_log(s->session_log_.get());

  SessionManagerConfig sm = options.sessions;
  sm.kv_capacity_bytes = s->model_.kv_capacity_bytes;
  sm.reservation_bytes = s->model_.reservation_bytes;
  sm.audit_bytes = s->model_.audit_bytes;
  ServiceConfig service = options.service;
  service.connections = options.connections;
  s->service_ = std::make_unique<PlayService>(service, s->model_, sm, s->worker_.get(), s->encoder_.get(),
                                              s->metrics_.get(), s->session_log_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  const auto client_certs = options.tls.client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  if (options.tls.enabled() && options.tls.reload_s > 0) {
    // gRPC watches the files: a certificate renewed in place is served
    // within reload_s, and files it cannot load leave the last good ones
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.tls.key_path, options.tls.cert_path, options.tls.client_ca_path,
        static_cast<unsigned>(options.tls.reload_s));
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_identity_key_cert_pairs();
    if (!options.tls.client_ca_path.empty()) tls.watch_root_certs();
    tls.set_cert_request_type(client_certs);
    credentials = grpc::experimental::TlsServerCredentials(tls);
  } else if (options.tls.enabled()) {
    grpc::SslServerCredentialsOptions tls(client_certs);
    tls.pem_key_cert_pairs.push_back({options.tls.private_key, options.tls.cert_chain});
    tls.pem_root_certs = options.tls.client_ca;
    credentials = grpc::SslServerCredentials(tls);
  }
  // the port is ours (listener.h): gRPC gets the connections it accepts
  auto listener = Listener::bind(options.host, options.port, options.connections);
  if (!listener.ok()) {
    s->worker_->stop();
    return listener.status();
  }
  s->listener_ = std::move(*listener);
  s->port_ = s->listener_->port();
  s->acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  if (options.connections.max_calls_per_s > 0) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
    counters.push_back(std::make_unique<CallCounter>(s->listener_.get()));
    builder.experimental().SetInterceptorCreators(std::move(counters));
  }
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.service.max_request_bytes));
  // no compressed requests: gRPC inflates a message whole before it checks
  // the size limit, so a 1 MB gzip request could cost a GB of memory; a
  // client's messages are small, and JPEGs do not compress anyway
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_send_bytes));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, options.handshake_timeout_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive.time_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive.timeout_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options.keepalive.min_client_ping_interval_s * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  if (options.max_concurrent_streams > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr) {
    s->listener_->stop();
    s->worker_->stop();
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server on ", address));
  }
  s->service_->set_health(s->grpc_->GetHealthCheckService());
  Listener::Callbacks cb;
  grpc::experimental::ExternalConnectionAcceptor* acceptor = s->acceptor_.get();
  cb.hand_over = [acceptor](int listener_fd, int fd) {
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
    p.listener_fd = listener_fd;
    p.fd = fd;
    acceptor->HandleNewConnection(&p);
  };
  Metrics* metrics = s->metrics_.get();
  cb.open_changed = [metrics](int open) { metrics->connections_open->Set(open); };
  const ConnectionCaps caps = options.connections;
  cb.refused = [metrics, caps, last = std::chrono::steady_clock::time_point()](absl::string_view reason,
                                                                               absl::string_view client) mutable {
    metrics->connections_refused(reason).Increment();
    // one line a second at most: a flood must not flood the log too
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(1)) return;
    last = now;
    if (reason == "client_cap") {
      std::fprintf(stderr, "wmserve: refused connections from %s: it has %d open (--max_connections_per_client)\n",
                   std::string(client).c_str(), caps.max_per_client);
    } else if (reason == "client_rate") {
      std::fprintf(stderr, "wmserve: refused connections from %s: more than %d at once, then %g a second "
                   "(--client_connection_burst, --client_connection_rate)\n",
                   std::string(client).c_str(), caps.burst_per_client, caps.rate_per_client);
    } else if (reason == "total_cap") {
      std::fprintf(stderr, "wmserve: refused connections: %d are open (--max_connections)\n", caps.max_total);
    } else if (reason == "client_blocked") {
      std::fprintf(stderr, "wmserve: refused connections from %s: refused for %g s after too many calls on one "
                   "(--max_calls_per_connection)\n", std::string(client).c_str(), caps.block_s);
    } else if (reason == "no_fds") {
      std::fprintf(stderr, "wmserve: an accept failed for want of file descriptors; retrying\n");
    }
  };
  // copied for each call (Listener::note_call): the last line's time is shared
  struct LogLimit {
    std::mutex mu;
    std::chrono::steady_clock::time_point last;
  };
  cb.shut_down = [metrics, caps, limit = std::make_shared<LogLimit>()](absl::string_view peer,
                                                                      absl::string_view client) {
    metrics->connections_shut_down->Increment();
    std::lock_guard<std::mutex> lk(limit->mu);  // gRPC's threads
    const auto now = std::chrono::steady_clock::now();
    if (now - limit->last < std::chrono::seconds(1)) return;
    limit->last = now;
    std::fprintf(stderr,
                 "wmserve: shut down the connection %s: more than %d calls in a second (--max_calls_per_connection); "
                 "%s is refused for %g s\n",
                 std::string(peer).c_str(), caps.max_calls_per_s, std::string(client).c_str(), caps.block_s);
  };
  s->listener_->start(std::move(cb));

  if (options.metrics_port >= 0) {
    const std::string maddr = absl::StrCat(options.metrics_host, ":", options.metrics_port);
    // civetweb as Debian builds it has no IPv6: say so rather than "null context"
    if (options.metrics_host.find(':') != std::string::npos) {
      s->shutdown(std::chrono::seconds(0));
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serve metrics on ", maddr,
                       ": the metrics endpoint listens on IPv4 only; give --metrics_host an IPv4 address "
                       "(e.g. 127.0.0.1) or --metrics_port -1"));
    }
    // civetweb would bind another address than a bad one typed (256.0.0.0:
    // every interface)
    if (absl::Status st = check_http_host(options.metrics_host, "--metrics_host"); !st.ok()) {
      s->shutdown(std::chrono::seconds(0));
      return absl::InvalidArgumentError(absl::StrCat("cannot serve metrics on ", maddr, ": ", st.message()));
    }
    try {
      // civetweb gives each connection a thread until its request is read:
      // enough threads that a few idle connections cannot hold every scrape
      // up, and a request's headers must come within a few seconds
      s->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
          "listening_ports", maddr, "num_threads", std::to_string(kMetricsThreads), "request_timeout_ms",
          std::to_string(kMetricsRequestTimeoutMs)});
    } catch (const std::exception& e) {
      s->shutdown(std::chrono::seconds(0));
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", maddr, ": ", e.what()));
    }
    // the credentials first: a scrape between the two would find /metrics open
    if (options.metrics_auth != nullptr) {
      s->metrics_auth_ = options.metrics_auth;
      // the exposer goes before the server (shutdown), so `raw` outlives every call
      Server* raw = s.get();
      s->exposer_->RegisterAuth(
          [raw](const std::string& user, const std::string& password) {
            std::shared_ptr<const TokenTable> table;
            {
              std::lock_guard<std::mutex> lk(raw->metrics_auth_mu_);
              table = raw->metrics_auth_;
            }
            if (password.empty()) return false;
            auto who = table->identify("Bearer " + password);
            return who.ok() && who->name == user;
          },
          "wmserve metrics");
    }
    s->exposer_->RegisterCollectable(s->metrics_->registry());
    const auto ports = s->exposer_->GetListeningPorts();
    s->metrics_port_ = ports.empty() ? options.metrics_port : ports.front();
  }
  return s;
}

void Server::set_metrics_auth(std::shared_ptr<const TokenTable> table) {
  std::lock_guard<std::mutex> lk(metrics_auth_mu_);
  if (metrics_auth_ != nullptr && table != nullptr) metrics_auth_ = std::move(table);
}

void Server::shutdown(Duration cancel_after) {
  if (shut_down_) return;
  shut_down_ = true;
  if (service_ != nullptr) service_->begin_drain(0);
  // every stream ends now; Shutdown waits for them and cancels the ones that
  // cannot finish (a client that stopped reading) after the deadline
  // (a start that failed early has no worker or encoders yet)
  if (worker_ != nullptr)
    worker_->close_all(absl::UnavailableError("the server is shutting down; start a new session elsewhere"),
                       EndReason::kShutdown);
  if (listener_ != nullptr) listener_->stop();
  if (grpc_ != nullptr) grpc_->Shutdown(std::chrono::system_clock::now() + cancel_after);
  if (worker_ != nullptr) worker_->stop();
  if (encoder_ != nullptr) encoder_->stop();
  // civetweb sees a stop only between polls of up to 2 s: woken, it takes
  // tens of milliseconds (an idle server took 1.5 s)
  if (exposer_ != nullptr) {
    std::unique_ptr<prometheus::Exposer> exposer = std::move(exposer_);
    stop_http_server([&] { exposer.reset(); }, options_.metrics_host, metrics_port_);
  }
}

Server::~Server() { shutdown(std::chrono::seconds(1)); }

}  // namespace wm::server
