#include "clients/play_client.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <future>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_interceptor.h"

namespace wm::client {

namespace v1 = ::wmserve::v1;

absl::Status check_server_address(const std::string& target) {
  if (target.empty()) return absl::InvalidArgumentError("--server is empty (host:port)");
  // a bracketed IPv6 address with no port: gRPC would dial port 0
  if (target.front() == '[' && target.back() == ']')
    return absl::InvalidArgumentError(
        absl::StrCat("--server '", target.substr(0, 128), "': give a port after the address: ", target, ":50051"));
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return absl::OkStatus();
  // nothing after the last colon: gRPC would dial port 443
  if (colon + 1 == target.size())
    return absl::InvalidArgumentError(
        absl::StrCat("--server '", target.substr(0, 128), "': no port after the colon (host:port)"));
  // an IPv6 address without brackets: gRPC takes all of it (`fe80::1:50051`
  // too) for the address and connects to its default port, 443. What comes
  // before the last colon is such an address when it holds a colon and
  // nothing but hex digits, colons and dots (a scheme, `unix:`, `ipv6:[...]`,
  // `dns:///`, a name, has other characters)
  const absl::string_view host = absl::string_view(target).substr(0, colon);
  const bool ipv6_literal = absl::StrContains(host, ':') && std::all_of(host.begin(), host.end(), [](char c) {
                              return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
                            });
  if (ipv6_literal)
    return absl::InvalidArgumentError(absl::StrCat("--server '", target.substr(0, 128),
                                                   "': an IPv6 address goes in brackets, with a port: [::1]:50051"));
  absl::string_view port = absl::string_view(target).substr(colon + 1);
  const bool sign = absl::ConsumePrefix(&port, "-") || absl::ConsumePrefix(&port, "+");
  if (port.empty() || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return absl::OkStatus();  // not a port: a unix: path, a name the resolver reads
  int64_t p = 0;
  if (sign || port.size() > 5 || !absl::SimpleAtoi(port, &p) || p < 1 || p > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--server '", target.substr(0, 128), "': the port must be 1..65535"));
  return absl::OkStatus();
}

namespace {

// adds the authorization metadata to every call of a channel (call
// credentials would do it on TLS channels only)
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      methods->GetSendInitialMetadata()->insert({"authorization", *value_});
    methods->Proceed();
  }

 private:
  const std::string* value_;  // the factory's, which the channel keeps
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(&value_);
  }

 private:
  const std::string value_;
};

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_s * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_s * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = options.tls_ca;
    tls.pem_private_key = options.tls_key;
    tls.pem_cert_chain = options.tls_cert;
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
    credentials = grpc::SslCredentials(tls);
  }
  if (options.auth_token.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(options.auth_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args, std::move(interceptors));
}

std::string describe_call_failure(const std::string& target, const grpc::Status& status) {
  const auto code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::string text = absl::StrCat("cannot reach wmserve at ", target, ": ", status.error_message());
    // a connection the server closed at once: it limits each address's connections
    if (absl::StrContains(status.error_message(), "Connection reset by peer") ||
        absl::StrContains(status.error_message(), "Socket closed"))
      absl::StrAppend(&text,
                      " (the server may be refusing connections from this address for now: too many open, opened "
                      "too fast, or too many calls on one; its log says which)");
    return text;
  }
  return absl::StrCat("wmserve at ", target, " refused the call (",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(code)), "): ", status.error_message());
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

HealthResult health_check(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                          std::chrono::milliseconds timeout) {
  // grpc.health.v1.HealthCheckRequest{service = 1} by hand: the health
  // protos are not part of the C++ packages
  std::string request;
  request.push_back(0x0a);
  size_t len = service.size();
  do {
    request.push_back(static_cast<char>((len & 0x7f) | (len > 0x7f ? 0x80 : 0)));
    len >>= 7;
  } while (len != 0);
  request += service;
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&done](grpc::Status st) { done.set_value(std::move(st)); });
  HealthResult r;
  r.status = done.get_future().get();
  if (!r.status.ok()) return r;
  std::vector<grpc::Slice> slices;
  if (!resp.Dump(&slices).ok()) return r;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1 (enum, varint)}; absent = UNKNOWN
  if (bytes.size() >= 2 && bytes[0] == 0x08) r.serving_status = static_cast<unsigned char>(bytes[1]) & 0x7f;
  return r;
}

const char* status_code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

v1::Action to_proto(const Action& a, uint64_t seq, int64_t client_time_us) {
  v1::Action m;
  m.set_seq(seq);
  m.set_keys(a.keys);
  m.set_mouse_dx(a.mouse[0]);
  m.set_mouse_dy(a.mouse[1]);
  m.set_client_time_us(client_time_us);
  return m;
}

PlayStream::PlayStream(const std::shared_ptr<grpc::Channel>& channel, std::chrono::system_clock::time_point deadline)
    : stub_(v1::WorldModel::NewStub(channel)) {
  if (deadline != std::chrono::system_clock::time_point::max()) context_.set_deadline(deadline);
  stream_ = stub_->Play(&context_);
}

PlayStream::~PlayStream() {
  if (!finished_) {
    context_.TryCancel();
    v1::PlayResponse r;
    while (stream_->Read(&r)) {
    }
    stream_->Finish().ok();
  }
}

grpc::Status PlayStream::start(const v1::Start& start) {
  v1::PlayRequest req;
  *req.mutable_start() = start;
  send(req);
  v1::PlayResponse r;
  while (read(&r)) {
    if (r.has_started()) {
      started_ = r.started();
      return grpc::Status::OK;
    }
  }
  return finish();
}

bool PlayStream::send(const v1::PlayRequest& request) {
  std::lock_guard<std::mutex> lk(write_mu_);
  if (writes_done_) return false;
  return stream_->Write(request);
}

bool PlayStream::send_action(const v1::Action& action) {
  v1::PlayRequest req;
  *req.mutable_action() = action;
  return send(req);
}

bool PlayStream::read(v1::PlayResponse* response) { return stream_->Read(response); }

void PlayStream::writes_done() {
  std::lock_guard<std::mutex> lk(write_mu_);
  if (writes_done_) return;
  writes_done_ = true;
  stream_->WritesDone();
}

grpc::Status PlayStream::finish() {
  if (!finished_) {
    finished_ = true;
    status_ = stream_->Finish();
  }
  return status_;
}

std::vector<double> PlayResult::intervals_s() const {
  std::vector<double> out;
  for (size_t i = 1; i < frames.size(); ++i)
    out.push_back(static_cast<double>(frames[i].received_us - frames[i - 1].received_us) / 1e6);
  return out;
}

PlayResult play(const std::shared_ptr<grpc::Channel>& channel, const PlayConfig& config) {
  PlayResult result;
  const int64_t t0 = now_us();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(config.timeout_s * 1e6));
  PlayStream stream(channel, deadline);
  result.status = stream.start(config.start);
  if (!result.status.ok()) {
    result.wall_s = static_cast<double>(now_us() - t0) / 1e6;
    return result;
  }
  result.started = stream.started();
  // more actions in flight than the server queues would only be refused (ACTION_QUEUE_FULL)
  const int queue = result.started.action_queue_capacity();
  const int window = std::max(1, queue > 0 ? std::min(config.window, queue) : config.window);

  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, int64_t> sent_at;  // seq -> client time, until acknowledged
  uint64_t acked = 0;
  bool ended = false;

  std::thread reader([&] {
    v1::PlayResponse r;
    bool stalled = false;
    while (stream.read(&r)) {
      const int64_t now = now_us();
      if (r.has_event()) {
        {
          std::lock_guard<std::mutex> lk(mu);
          result.events.push_back(r.event());
          // a refused action gets no frame of its own
          if (r.event().action_seq() != 0) sent_at.erase(r.event().action_seq());
        }
        cv.notify_all();
        continue;
      }
      if (!r.has_frame()) continue;
      const v1::Frame& f = r.frame();
      FrameRecord rec;
      rec.index = f.index();
      rec.last_action_seq = f.last_action_seq();
      rec.received_us = now;
      rec.timings = f.timings();
      rec.kv_cache_bytes = f.kv_cache_bytes();
      rec.frames_dropped = f.frames_dropped();
      rec.deadline_missed = f.deadline_missed();
      if (config.keep_jpeg) rec.jpeg = f.jpeg();
      if (config.on_frame) config.on_frame(f);
      {
        std::lock_guard<std::mutex> lk(mu);
        // an action's latency: until the first frame that applies it (or a later one)
        while (!sent_at.empty() && sent_at.begin()->first <= f.last_action_seq()) {
          result.action_to_frame_s.push_back(static_cast<double>(now - sent_at.begin()->second) / 1e6);
          sent_at.erase(sent_at.begin());
        }
        acked = std::max<uint64_t>(acked, f.last_action_seq());
        result.frames.push_back(std::move(rec));
      }
      cv.notify_all();
      if (!stalled && config.reader_stall_s > 0) {
        stalled = true;
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(config.reader_stall_s * 1e6)));
      }
    }
    std::lock_guard<std::mutex> lk(mu);
    ended = true;
    cv.notify_all();
  });

  if (config.start_delay_s > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(config.start_delay_s * 1e6)));
  const int64_t send_t0 = now_us();
  const auto until = [&](auto pred) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_until(lk, deadline, [&] { return ended || pred(); });
    return !ended;
  };
  bool ok = true;
  for (size_t i = 0; i < config.actions.size() && ok; ++i) {
    const uint64_t seq = i + 1;
    if (config.send_fps > 0) {
      const int64_t at = send_t0 + static_cast<int64_t>(static_cast<double>(i) * 1e6 / config.send_fps);
      const int64_t wait = at - now_us();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::microseconds(wait));
    } else {
      ok = until([&] { return sent_at.size() < static_cast<size_t>(window); });
      if (!ok) break;
    }
    const int64_t now = now_us();
    {
      std::lock_guard<std::mutex> lk(mu);
      if (ended) break;
      sent_at[seq] = now;
    }
    if (!stream.send_action(to_proto(config.actions[i], seq, now))) break;
    ++result.actions_sent;
  }
  // wait for the last action's frame, linger, then half-close and read to the end
  until([&] { return sent_at.empty(); });
  if (config.linger_s > 0) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::microseconds(static_cast<int64_t>(config.linger_s * 1e6)), [&] { return ended; });
  }
  stream.writes_done();
  reader.join();
  result.status = stream.finish();
  result.last_acked_seq = acked;
  result.wall_s = static_cast<double>(now_us() - t0) / 1e6;
  return result;
}

}  // namespace wm::client
