#include "server/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/session_manager.h"

namespace wm::server {

namespace {

constexpr int kBacklog = 1024;
constexpr int kSweepMs = 1000;      // connections gRPC closed are found at least this often
constexpr int kNoFdsPauseMs = 100;  // after an accept failed for want of descriptors

absl::string_view verdict_label(ConnectionTable::Verdict v) {
  switch (v) {
    case ConnectionTable::Verdict::kClientCap: return "client_cap";
    case ConnectionTable::Verdict::kTotalCap: return "total_cap";
    case ConnectionTable::Verdict::kClientRate: return "client_rate";
    case ConnectionTable::Verdict::kClientBlocked: return "client_blocked";
    default: return "not_a_socket";
  }
}

absl::Status bind_error(const std::string& host, int port, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, " (", what, ")"));
}

}  // namespace

std::string peer_of_sockaddr(const void* addr, size_t len, bool with_port) {
  char text[INET6_ADDRSTRLEN] = "";
  const auto* sa = static_cast<const sockaddr*>(addr);
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = static_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return absl::StrCat("ipv4:", text, with_port ? absl::StrCat(":", ntohs(in->sin_port)) : "");
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = static_cast<const sockaddr_in6*>(addr);
    const std::string port = with_port ? absl::StrCat(":", ntohs(in6->sin6_port)) : "";
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      inet_ntop(AF_INET, in6->sin6_addr.s6_addr + 12, text, sizeof text);
      return absl::StrCat("ipv4:", text, port);
    }
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return absl::StrCat("ipv6:[", text, "]", port);
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::bind(const std::string& host, int port, ConnectionCaps caps) {
  // port 0 on several addresses: the port the first one got may be taken on
  // another (an IPv6 listener beside an IPv4 one); a new pick then
  bool clash = false;
  for (int attempt = 0;; ++attempt) {
    auto l = bind_once(host, port, caps, &clash);
    if (l.ok() || !clash || attempt == 7) return l;
  }
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::bind_once(const std::string& host, int port, ConnectionCaps caps,
                                                              bool* port_clash) {
  *port_clash = false;
  std::string name = host;
  if (absl::StartsWith(name, "[") && absl::EndsWith(name, "]")) name = name.substr(1, name.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int e = getaddrinfo(name.empty() ? nullptr : name.c_str(), service.c_str(), &hints, &found); e != 0)
    return bind_error(host, port, gai_strerror(e));
  bool any_v4 = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) any_v4 = any_v4 || a->ai_family == AF_INET;
  std::vector<int> fds;
  auto fail = [&](absl::string_view what) {
    for (int fd : fds) close(fd);
    freeaddrinfo(found);
    return bind_error(host, port, what);
  };
  int bound_port = port;
  std::string skipped;  // why an address this machine does not have was left out
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && errno == EAFNOSUPPORT) {
      // "localhost" on a machine without IPv6: the other address serves
      skipped = std::strerror(errno);
      continue;
    }
    if (fd < 0) return fail(std::strerror(errno));
    fds.push_back(fd);
    const int one = 1;
    // a restart binds at once over connections in TIME_WAIT; no SO_REUSEPORT,
    // so a port another process listens on is refused, not shared
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6) {
      // "::" alone takes IPv4 too; beside an IPv4 address of its own, IPv6 only
      const int v6only = any_v4 ? 1 : 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    }
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    // port 0: the first socket picks the port, the others take the same
    if (a->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(bound_port));
    else reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(bound_port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) != 0) {
      if (errno == EADDRNOTAVAIL && found->ai_next != nullptr) {
        skipped = std::strerror(errno);
        fds.pop_back();
        close(fd);
        continue;
      }
      *port_clash = errno == EADDRINUSE && port == 0 && fds.size() > 1;
      return fail(std::strerror(errno));
    }
    if (listen(fd, kBacklog) != 0) return fail(std::strerror(errno));
    sockaddr_storage got{};
    socklen_t len = sizeof got;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len) != 0) return fail(std::strerror(errno));
    bound_port = ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                                : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  freeaddrinfo(found);
  if (fds.empty()) return bind_error(host, port, skipped.empty() ? "no IPv4 or IPv6 address" : skipped);
  return std::unique_ptr<Listener>(new Listener(std::move(fds), bound_port, caps));
}

Listener::Listener(std::vector<int> fds, int port, ConnectionCaps caps)
    : fds_(std::move(fds)), port_(port), wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), table_(caps) {}

Listener::~Listener() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Listener::start(Callbacks callbacks) {
  {
    std::lock_guard<std::mutex> lk(mu_);  // note_call reads shut_down on gRPC's threads
    callbacks_ = std::move(callbacks);
  }
  thread_ = std::thread([this] { run(); });
}

void Listener::stop() {
  if (!stopping_.exchange(true) && thread_.joinable()) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0) {
      // the thread notices stopping_ at its next sweep
    }
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_) close(fd);
  fds_.clear();
}

void Listener::run() {
  std::vector<pollfd> polled;
  for (int fd : fds_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_fd_, POLLIN, 0});
  auto last_sweep = Clock::now();
  while (!stopping_.load()) {
    const int n = poll(polled.data(), polled.size(), kSweepMs);
    if (stopping_.load()) break;
    for (size_t i = 0; n > 0 && i + 1 < polled.size(); ++i)
      if (polled[i].revents & POLLIN) accept_from(polled[i].fd);
    // each second, idle or not, so that the gauge follows what gRPC closed
    int open = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (const auto now = Clock::now(); now - last_sweep >= std::chrono::milliseconds(kSweepMs)) {
        table_.sweep();
        last_sweep = now;
      }
      open = table_.open();
    }
    if (open != last_open_ && callbacks_.open_changed) {
      last_open_ = open;
      callbacks_.open_changed(open);
    }
  }
}

void Listener::note_call(absl::string_view peer) {
  std::string client;
  std::function<void(absl::string_view, absl::string_view)> tell;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!table_.note_call(peer, Clock::now(), &client)) return;
    tell = callbacks_.shut_down;
  }
  if (tell) tell(peer, client);
}

void Listener::accept_from(int listener_fd) {
  // what is waiting, but a bounded batch: the other sockets get their turn
  for (int i = 0; i < 64 && !stopping_.load(); ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = accept4(listener_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // the connection waits in the backlog; try again shortly (gRPC's
        // own acceptor would have stopped for good)
        if (callbacks_.refused) callbacks_.refused("no_fds", "");
        {
          std::lock_guard<std::mutex> lk(mu_);
          table_.sweep();
        }
        pollfd wake{wake_fd_, POLLIN, 0};
        poll(&wake, 1, kNoFdsPauseMs);
      }
      return;  // EAGAIN: nothing more waits
    }
    const std::string client = client_group(peer_of_sockaddr(&addr, len));
    ConnectionTable::Verdict v;
    {
      std::lock_guard<std::mutex> lk(mu_);
      v = table_.admit(fd, client, peer_of_sockaddr(&addr, len, /*with_port=*/true), Clock::now());
    }
    if (v != ConnectionTable::Verdict::kAdmitted) {
      if (callbacks_.refused) callbacks_.refused(verdict_label(v), client);
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (callbacks_.hand_over) {
      callbacks_.hand_over(listener_fd, fd);
    } else {
      close(fd);
    }
  }
}

}  // namespace wm::server
