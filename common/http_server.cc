#include "common/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace wm {
namespace {

// where a connection reaches the server: the host as an IPv4 address or a
// name (the first IPv4 address it resolves to), 127.0.0.1 for the wildcard
// or anything unresolved
in_addr wake_address(const std::string& host) {
  in_addr a{};
  a.s_addr = htonl(INADDR_LOOPBACK);
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) == 1) {
    if (parsed.s_addr != htonl(INADDR_ANY)) a = parsed;
    return a;
  }
  if (host.empty()) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res != nullptr) {
    a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  return a;
}

}  // namespace

absl::Status check_http_host(const std::string& host, absl::string_view what) {
  if (!host.empty() && absl::ascii_isdigit(static_cast<unsigned char>(host[0]))) {
    in_addr v4;
    if (inet_pton(AF_INET, host.c_str(), &v4) != 1)
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", host, " is not an IPv4 address (four decimal numbers 0..255, no leading zeros)"));
    return absl::OkStatus();
  }
  const auto name_char = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  };
  if (host.empty() || !std::all_of(host.begin(), host.end(), name_char))
    return absl::InvalidArgumentError(absl::StrCat(what, " '", host,
                                                   "' is neither an IPv4 address nor a host name"));
  return absl::OkStatus();
}

void stop_http_server(const std::function<void()>& stop, const std::string& host, int port) {
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    stop();
    stopped.store(true);
  });
  if (port > 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr = wake_address(host);
    while (!stopped.load()) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        // at most 20 ms for the handshake: an address that does not answer
        // costs no more than the stop would have taken anyway
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          ::poll(&p, 1, 20);
        }
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  stopper.join();
}

}  // namespace wm
