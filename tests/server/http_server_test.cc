// stop_http_server: while the stop runs, connections of its own reach the
// listening port (they wake civetweb's listener, which looks for a stop only
// between its polls). Here the "server" is a plain listening socket whose
// stop waits for such a connection.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "common/http_server.h"

namespace wm {
namespace {

// a socket listening on bind_host (an IPv4 address) at a free port
int listen_on(const std::string& bind_host, int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, bind_host.c_str(), &a.sin_addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) return -1;
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// a stop that returns once a connection arrives, or after 10 s without one
bool stop_waits_for_a_connection(int listen_fd) {
  pollfd p{listen_fd, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return false;
  const int c = ::accept(listen_fd, nullptr, nullptr);
  if (c < 0) return false;
  ::close(c);
  return true;
}

// civetweb shifts an address's four numbers into place unchecked: only a
// strict IPv4 address or a host name reaches it
TEST(HttpHost, StrictIpv4OrAHostName) {
  for (const char* ok : {"127.0.0.1", "0.0.0.0", "255.255.255.255", "localhost", "metrics-1.example.org"})
    EXPECT_TRUE(check_http_host(ok, "--flag").ok()) << ok;
  for (const char* bad : {"256.0.0.0", "127.0.0.256", "999.9.9.9", "127.1", "0x7f.1", "1.2.3.4.5", "127.0.0.01",
                          "", "a_b", "host name", "::1"}) {
    const absl::Status st = check_http_host(bad, "--flag");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StartsWith(st.message(), "--flag ")) << st;
  }
}

TEST(HttpStop, ConnectsToTheListeningPortWhileTheStopRuns) {
  // as the servers are given their address: numeric, the wildcard, a name
  for (const auto& [bind_host, host] : {std::pair<std::string, std::string>{"127.0.0.1", "127.0.0.1"},
                                        {"0.0.0.0", "0.0.0.0"},
                                        {"0.0.0.0", ""},
                                        {"127.0.0.1", "localhost"}}) {
    SCOPED_TRACE(bind_host + " reached as '" + host + "'");
    int port = 0;
    const int fd = listen_on(bind_host, &port);
    ASSERT_GE(fd, 0);
    int stops = 0;
    bool woken = false;
    stop_http_server(
        [&] {
          ++stops;
          woken = stop_waits_for_a_connection(fd);
        },
        host, port);
    EXPECT_EQ(stops, 1);
    EXPECT_TRUE(woken);
    ::close(fd);
  }
}

TEST(HttpStop, WithNoPortRunsTheStopAndConnectsNowhere) {
  int port = 0;
  const int fd = listen_on("127.0.0.1", &port);
  ASSERT_GE(fd, 0);
  int stops = 0;
  stop_http_server([&] { ++stops; }, "127.0.0.1", 0);
  EXPECT_EQ(stops, 1);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 100), 0);  // nothing knocked on a port it was not given
  ::close(fd);
}

}  // namespace
}  // namespace wm
