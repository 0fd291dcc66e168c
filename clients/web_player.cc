#include "clients/web_player.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <condition_variable>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/play_client.h"
#include "clients/web_player_page.h"
#include "common/http_server.h"

namespace wm::client {

namespace v1 = ::wmserve::v1;

namespace {

using SteadyClock = std::chrono::steady_clock;

// how far one post may move the mouse: keeps the accumulator bounded
constexpr float kMaxMouseAccumulated = 1000.0f;
// how long civetweb waits for a whole request (and for each write of a stream)
constexpr int kRequestTimeoutMs = 10000;

void reply(mg_connection* conn, int code, const char* type, const std::string& body) {
  const char* text = code == 200 ? "OK" : code == 400 ? "Bad Request" : code == 404 ? "Not Found"
                   : code == 405 ? "Method Not Allowed" : code == 409 ? "Conflict" : code == 502 ? "Bad Gateway"
                   : code == 503 ? "Service Unavailable" : "Error";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n",
            code, text, type, body.size());
  mg_write(conn, body.data(), body.size());
}

// JSON text; bytes that are not UTF-8 (from a URL, a body or the server)
// become U+FFFD instead of an exception in an HTTP thread
std::string json_text(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void reply_error(mg_connection* conn, int code, const std::string& message) {
  reply(conn, code, "application/json", json_text(nlohmann::json{{"error", message}}));
}

// a query-string parameter ("" when absent; *too_long when it does not fit
// 127 bytes); the body stays unread (CivetServer::getParam would consume it)
std::string param(mg_connection* conn, const char* name, bool* too_long = nullptr) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->query_string == nullptr) return "";
  char buf[128];
  const int n = mg_get_var(ri->query_string, std::strlen(ri->query_string), name, buf, sizeof(buf));
  if (too_long != nullptr) *too_long = n == -2;
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// one browser page's session
struct Player {
  std::string id;
  std::unique_ptr<PlayStream> stream;
  v1::Started started;
  SteadyClock::time_point created;
  std::mutex mu;  // the input state below
  uint32_t keys = 0;
  float dx = 0, dy = 0;
  bool attached = false;
  std::atomic<bool> done{false};
  std::thread sender;

  std::mutex end_mu;  // end() may run on the page's thread and at shutdown at once

  // what the page's /stats shows: frames delivered, their recent arrival
  // times and action-to-frame latencies (this process's clock: the frame
  // echoes its action's send time); bounded rings
  static constexpr size_t kRecent = 256;
  std::mutex stats_mu;
  int64_t frames = 0, deadline_missed = 0;
  uint64_t frames_dropped = 0;
  std::vector<SteadyClock::time_point> arrivals;  // ring of kRecent
  std::vector<double> latency_ms;                 // ring of kRecent
  void record(const v1::Frame& f) {
    std::lock_guard<std::mutex> lk(stats_mu);
    const size_t at = static_cast<size_t>(frames % static_cast<int64_t>(kRecent));
    if (arrivals.size() < kRecent) {
      arrivals.push_back(SteadyClock::now());
    } else {
      arrivals[at] = SteadyClock::now();
    }
    if (f.client_time_us() > 0) {
      const double ms = static_cast<double>(now_us() - f.client_time_us()) / 1000.0;
      if (latency_ms.size() < kRecent) {
        latency_ms.push_back(ms);
      } else {
        latency_ms[static_cast<size_t>(frames) % kRecent] = ms;
      }
    }
    ++frames;
    frames_dropped = f.frames_dropped();
    if (f.deadline_missed()) ++deadline_missed;
  }

  // ends the session: the sender stops, then the stream is half-closed, so
  // that wmserve ends the session (a cancel alone reads as a dropped
  // connection: the session would stay parked for a resume, holding its KV
  // budget and one of this address's sessions); whatever is still in flight
  // is read and dropped, and a server that does not end the stream within
  // 2 s is cancelled. Called by the reader once it stopped, or at destruction.
  void end() {
    std::lock_guard<std::mutex> lk(end_mu);
    done = true;
    if (sender.joinable() && sender.get_id() != std::this_thread::get_id()) sender.join();
    if (stream->finished()) return;
    stream->writes_done();
    std::mutex m;
    std::condition_variable cv;
    bool drained = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> l(m);
      if (!cv.wait_for(l, std::chrono::seconds(2), [&] { return drained; })) stream->cancel();
    });
    v1::PlayResponse r;
    while (stream->read(&r)) {
    }
    {
      std::lock_guard<std::mutex> l(m);
      drained = true;
    }
    cv.notify_one();
    watchdog.join();
    stream->finish();
  }
  ~Player() { end(); }
};

class WebPlayer {
 public:
  explicit WebPlayer(const WebPlayerOptions& o) : o_(o), channel_(make_channel(o.server, o.channel)) {}

  void handle(mg_connection* conn) {
    const mg_request_info* ri = mg_get_request_info(conn);
    const std::string uri = ri->local_uri != nullptr ? ri->local_uri : "";
    const std::string method = ri->request_method != nullptr ? ri->request_method : "";
    const bool get = method == "GET", post = method == "POST";
    if (uri == "/" && get) return reply(conn, 200, "text/html; charset=utf-8", kWebPlayerPage);
    if (uri == "/players" && post) return create(conn);
    if (uri == "/stream" && get) return stream(conn);
    if (uri == "/input" && post) return input(conn);
    if (uri == "/stats" && get) return stats(conn);
    if (uri == "/" || uri == "/players" || uri == "/stream" || uri == "/input" || uri == "/stats")
      return reply_error(conn, 405, method + " is not allowed on " + uri);
    reply_error(conn, 404, "no page " + uri);
  }

  // ends players whose page never opened the stream
  void sweep() {
    std::vector<std::shared_ptr<Player>> stale;
    {
      std::lock_guard<std::mutex> lk(mu_);
      const auto now = SteadyClock::now();
      for (auto it = players_.begin(); it != players_.end();) {
        bool attached;
        {
          std::lock_guard<std::mutex> plk(it->second->mu);
          attached = it->second->attached;
        }
        if (!attached && now - it->second->created > std::chrono::duration<double>(o_.attach_timeout_s)) {
          stale.push_back(it->second);
          it = players_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& p : stale) p->end();
  }

  void stop_all() {
    std::map<std::string, std::shared_ptr<Player>> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      all.swap(players_);
    }
    for (auto& [id, p] : all) p->end();
  }

 private:
  std::shared_ptr<Player> find(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = players_.find(id);
    return it == players_.end() ? nullptr : it->second;
  }

  void forget(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    players_.erase(id);
  }

  std::string new_id() {
    std::lock_guard<std::mutex> lk(mu_);
    return absl::StrCat(absl::Hex(rng_(), absl::kZeroPad16));
  }

  void create(mg_connection* conn) {
    uint64_t seed = 0;
    bool too_long = false;
    const std::string s = param(conn, "seed", &too_long);
    if (too_long) return reply_error(conn, 400, "seed is longer than a 64-bit number");
    if (s.empty()) {
      std::lock_guard<std::mutex> lk(mu_);
      seed = rng_() % 1000000;
    } else if (!absl::SimpleAtoi(s, &seed)) {
      return reply_error(conn, 400, "seed '" + s + "' is not a non-negative integer");
    }
    // a slot is taken before the (slow) Start and given back if it fails, so
    // that concurrent requests cannot start more players than --max_players
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (static_cast<int>(players_.size()) + starting_ >= o_.max_players)
        return reply_error(conn, 503, absl::StrCat("all ", o_.max_players, " player slots are taken (--max_players)"));
      ++starting_;
    }
    struct Starting {
      WebPlayer& w;
      ~Starting() {
        std::lock_guard<std::mutex> lk(w.mu_);
        --w.starting_;
      }
    } starting{*this};
    auto p = std::make_shared<Player>();
    p->id = new_id();
    p->created = SteadyClock::now();
    p->stream = std::make_unique<PlayStream>(channel_);
    v1::Start start;
    start.set_model(o_.model);
    start.set_cache_format(o_.format);
    start.set_seed(seed);
    start.set_pacing(v1::PACING_FIXED_RATE);
    start.set_fps(o_.fps);
    start.set_jpeg_quality(o_.quality);
    const grpc::Status st = p->stream->start(start);
    if (!st.ok()) {
      return reply_error(conn, 502, absl::StrCat("wmserve at ", o_.server, ": ", status_code_name(st.error_code()),
                                                 ": ", st.error_message()));
    }
    p->started = p->stream->started();
    const v1::ActionSpace& space = p->started.action_space();
    p->sender = std::thread([this, p = p.get(), limit = space.mouse_limit(), nkeys = space.keys_size()] {
      send_loop(*p, limit, nkeys);
    });
    nlohmann::json keys = nlohmann::json::array();
    for (const auto& k : space.keys()) keys.push_back(k);
    const nlohmann::json j = {{"id", p->id},
                              {"session_id", p->started.session_id()},
                              {"model", p->started.model().name()},
                              {"cache_format", p->started.cache_format()},
                              {"seed", seed},
                              {"width", p->started.width()},
                              {"height", p->started.height()},
                              {"fps", p->started.fps()},
                              {"keys", keys},
                              {"mouse_limit", space.mouse_limit()}};
    {
      std::lock_guard<std::mutex> lk(mu_);
      players_[p->id] = p;
    }
    reply(conn, 200, "application/json", json_text(j));
  }

  // one action per tick: the keys held now and the mouse moved since the last tick
  void send_loop(Player& p, float limit, int nkeys) {
    const auto period = std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(1.0 / o_.fps));
    auto next = SteadyClock::now();
    const float lim = limit > 0 ? limit : kMaxMouseAccumulated;
    const uint32_t mask = nkeys >= 32 ? ~0u : ((1u << nkeys) - 1);
    for (uint64_t seq = 1; !p.done; ++seq) {
      Action a;
      {
        std::lock_guard<std::mutex> lk(p.mu);
        a.keys = p.keys & mask;
        a.mouse[0] = std::clamp(p.dx, -lim, lim);
        a.mouse[1] = std::clamp(p.dy, -lim, lim);
        p.dx -= a.mouse[0];  // what the limit left waits for the next tick
        p.dy -= a.mouse[1];
      }
      if (!p.stream->send_action(to_proto(a, seq, now_us()))) break;
      next += period;
      std::this_thread::sleep_until(next);
    }
  }

  void stream(mg_connection* conn) {
    const std::string id = param(conn, "id");
    std::shared_ptr<Player> p = find(id);
    if (p == nullptr) return reply_error(conn, 404, "no player '" + id + "' (it ended, or never existed)");
    {
      std::lock_guard<std::mutex> lk(p->mu);
      if (p->attached) return reply_error(conn, 409, "player '" + id + "' already has its stream");
      p->attached = true;
    }
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary=wmframe\r\n"
              "Cache-Control: no-store\r\nConnection: close\r\n\r\n");
    v1::PlayResponse r;
    while (!p->done && p->stream->read(&r)) {
      if (!r.has_frame()) continue;
      p->record(r.frame());
      const std::string& jpeg = r.frame().jpeg();
      const std::string head = absl::StrCat("--wmframe\r\nContent-Type: image/jpeg\r\nContent-Length: ", jpeg.size(),
                                            "\r\nX-Frame-Index: ", r.frame().index(), "\r\n\r\n");
      if (mg_write(conn, head.data(), head.size()) <= 0 || mg_write(conn, jpeg.data(), jpeg.size()) <= 0 ||
          mg_write(conn, "\r\n", 2) <= 0)
        break;  // the page went away
    }
    forget(id);
    p->end();
  }

  void input(mg_connection* conn) {
    const std::string id = param(conn, "id");
    std::shared_ptr<Player> p = find(id);
    if (p == nullptr) return reply_error(conn, 404, "no player '" + id + "'");
    char buf[257];
    const int n = mg_read(conn, buf, sizeof(buf) - 1);
    if (n <= 0) return reply_error(conn, 400, "empty input: expected \"KEYS DX DY\"");
    if (n > 255) return reply_error(conn, 400, "input longer than 255 bytes: expected \"KEYS DX DY\"");
    buf[n] = '\0';
    const std::vector<std::string> f = absl::StrSplit(std::string(buf, static_cast<size_t>(n)), ' ', absl::SkipEmpty());
    uint32_t keys = 0;
    float dx = 0, dy = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &keys) || !absl::SimpleAtof(f[1], &dx) ||
        !absl::SimpleAtof(f[2], &dy) || !std::isfinite(dx) || !std::isfinite(dy))
      return reply_error(conn, 400, "bad input '" + std::string(buf) + "': expected \"KEYS DX DY\"");
    {
      std::lock_guard<std::mutex> lk(p->mu);
      p->keys = keys;
      p->dx = std::clamp(p->dx + dx, -kMaxMouseAccumulated, kMaxMouseAccumulated);
      p->dy = std::clamp(p->dy + dy, -kMaxMouseAccumulated, kMaxMouseAccumulated);
    }
    reply(conn, 200, "application/json", "{}");
  }

  // a player's frame rate over the last 2 s and its recent action-to-frame latencies
  void stats(mg_connection* conn) {
    const std::string id = param(conn, "id");
    std::shared_ptr<Player> p = find(id);
    if (p == nullptr) return reply_error(conn, 404, "no player '" + id + "'");
    nlohmann::json j;
    {
      std::lock_guard<std::mutex> lk(p->stats_mu);
      const auto now = SteadyClock::now();
      const auto window = std::chrono::seconds(2);
      int64_t recent = 0;
      auto oldest = now, newest = SteadyClock::time_point{};
      for (const auto& t : p->arrivals)
        if (now - t <= window) {
          ++recent;
          oldest = std::min(oldest, t);
          newest = std::max(newest, t);
        }
      // the frames after the window's first, over the time they took
      const double span = recent > 1 ? std::chrono::duration<double>(newest - oldest).count() : 0.0;
      std::vector<double> lat = p->latency_ms;
      std::sort(lat.begin(), lat.end());
      auto pct = [&](double q) {
        return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(q * static_cast<double>(lat.size())))];
      };
      j = {{"frames", p->frames},
           {"fps", recent > 1 && span > 0 ? std::round(static_cast<double>(recent - 1) / span * 10) / 10 : 0.0},
           {"latency_ms_p50", std::round(pct(0.50) * 10) / 10},
           {"latency_ms_p95", std::round(pct(0.95) * 10) / 10},
           {"frames_dropped", p->frames_dropped},
           {"deadline_missed", p->deadline_missed}};
    }
    reply(conn, 200, "application/json", json_text(j));
  }

  const WebPlayerOptions o_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Player>> players_;
  int starting_ = 0;  // players between their slot check and joining players_
  std::mt19937_64 rng_{std::random_device{}()};
};

// --web's HOST:PORT, checked before civetweb reads it (check_http_host: an
// IPv4 address's numbers went unchecked); a bare port bound every
// interface
absl::Status check_listen_address(const std::string& listen) {
  const absl::Status usage = absl::InvalidArgumentError(absl::StrCat(
      "--web must be HOST:PORT (HOST an IPv4 address, [an IPv6 address] or a host name; PORT 0..65535, 0: any "
      "free one), not '",
      listen, "'"));
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return usage;
  const std::string host = listen.substr(0, colon), port = listen.substr(colon + 1);
  int port_number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number > 65535)
    return usage;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    in6_addr v6;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) != 1)
      return absl::InvalidArgumentError(absl::StrCat("--web ", listen, ": ", host, " is not an IPv6 address"));
    if (mg_check_feature(8) == 0)  // Debian's civetweb is built without IPv6
      return absl::InvalidArgumentError(absl::StrCat(
          "--web ", listen, ": this wmplay's HTTP server (civetweb) has no IPv6; give an IPv4 address or a host name"));
    return absl::OkStatus();
  }
  // an IPv4 address (strictly) or a host name, which civetweb resolves
  if (host.empty()) return usage;
  return check_http_host(host, absl::StrCat("--web ", listen, ":"));
}

class Handler final : public CivetHandler {
 public:
  explicit Handler(WebPlayer& w) : w_(w) {}
  bool handleGet(CivetServer*, mg_connection* c) override { return handle(c); }
  bool handlePost(CivetServer*, mg_connection* c) override { return handle(c); }
  bool handlePut(CivetServer*, mg_connection* c) override { return handle(c); }
  bool handleDelete(CivetServer*, mg_connection* c) override { return handle(c); }

 private:
  // an exception must not leave civetweb's thread (it would end the process)
  bool handle(mg_connection* c) {
    try {
      w_.handle(c);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "wmplay: request failed: %s\n", e.what());
    }
    return true;
  }
  WebPlayer& w_;
};

}  // namespace

int run_web_player(const WebPlayerOptions& o) {
  if (!fps_in_range(o.fps)) {
    std::fprintf(stderr, "wmplay: --fps must be 0.001..1000 with --web (the server's --max_fps may allow less)\n");
    return 2;
  }
  if (o.max_players < 1 || o.max_players > 1000) {
    std::fprintf(stderr, "wmplay: --max_players must be 1..1000\n");
    return 2;
  }
  if (const absl::Status st = check_listen_address(o.listen); !st.ok()) {
    std::fprintf(stderr, "wmplay: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  // SIGINT/SIGTERM go to the main thread's sigtimedwait, never to a server thread
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  WebPlayer player(o);
  Handler handler(player);
  std::unique_ptr<CivetServer> http;
  try {
    // A stream holds a thread for its whole session: room for every player,
    // and 32 threads more, so that a few clients that send their requests a
    // byte at a time (slowloris) do not hold every thread; civetweb gives up
    // on a request that has not arrived whole within request_timeout_ms
    // (its default, 30 s, let a dozen such clients stall the page that long).
    const std::vector<std::string> options = {"listening_ports", o.listen,
                                              "num_threads", std::to_string(2 * o.max_players + 32),
                                              "request_timeout_ms", std::to_string(kRequestTimeoutMs),
                                              "enable_keep_alive", "no"};
    http = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    std::fprintf(stderr, "wmplay: cannot listen on %s: %s\n", o.listen.c_str(), e.what());
    return 1;
  }
  http->addHandler("/", handler);
  const std::vector<int> ports = http->getListeningPorts();
  const int port = ports.empty() ? 0 : ports[0];
  if (!o.port_file.empty()) {
    // written whole, then renamed: a reader never sees half a file
    const std::string tmp = o.port_file + ".tmp";
    std::ofstream out(tmp);
    out << "{\"port\": " << port << "}\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), o.port_file.c_str()) != 0) {
      std::fprintf(stderr, "wmplay: cannot write --port_file %s: %s\n", o.port_file.c_str(), std::strerror(errno));
      std::remove(tmp.c_str());
      http->close();
      return 1;
    }
  }
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  std::printf("wmplay: open http://%s:%d/ to play (wmserve at %s, %g frames/s); Ctrl-C stops\n",
              host.empty() ? "localhost" : host.c_str(), port, o.server.c_str(), o.fps);
  std::fflush(stdout);
  const timespec tick{1, 0};
  while (sigtimedwait(&signals, nullptr, &tick) < 0) player.sweep();
  std::printf("wmplay: stopping\n");
  player.stop_all();
  // civetweb sees a stop only between polls of up to 2 s: woken, it takes
  // tens of milliseconds (an idle page server took 0.95 s)
  stop_http_server([&] { http->close(); }, host, port);
  return 0;
}

}  // namespace wm::client
