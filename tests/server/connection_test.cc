// The gRPC port's connection caps: the table against real sockets (a
// connection is known by its descriptor and its socket's inode), and the
// listener's accept thread on loopback.
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "server/clock.h"
#include "server/connection_table.h"
#include "server/listener.h"

namespace wm::server {
namespace {

using Verdict = ConnectionTable::Verdict;

int new_socket() { return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }

TEST(ConnectionTable, CountsPerClientAndInTotalAndFreesWhatWasClosed) {
  ConnectionTable t({/*max_total=*/3, /*max_per_client=*/2});
  const int a1 = new_socket(), a2 = new_socket(), a3 = new_socket(), b1 = new_socket(), c1 = new_socket();
  EXPECT_EQ(t.admit(a1, "a", "p" + std::to_string(a1), TimePoint{}), Verdict::kAdmitted);
  EXPECT_EQ(t.admit(a2, "a", "p" + std::to_string(a2), TimePoint{}), Verdict::kAdmitted);
  EXPECT_EQ(t.admit(a3, "a", "p" + std::to_string(a3), TimePoint{}), Verdict::kClientCap);  // not counted: the caller closes it
  EXPECT_EQ(t.admit(b1, "b", "p" + std::to_string(b1), TimePoint{}), Verdict::kAdmitted);
  EXPECT_EQ(t.admit(c1, "c", "p" + std::to_string(c1), TimePoint{}), Verdict::kTotalCap);
  EXPECT_EQ(t.open(), 3);
  EXPECT_EQ(t.open_from("a"), 2);
  // a connection closed (by gRPC, which never says) makes room at the next cap hit
  close(a1);
  EXPECT_EQ(t.open(), 3);  // not known yet
  EXPECT_EQ(t.admit(a3, "a", "p" + std::to_string(a3), TimePoint{}), Verdict::kAdmitted);
  EXPECT_EQ(t.open_from("a"), 2);
  close(b1);
  t.sweep();
  EXPECT_EQ(t.open(), 2);
  EXPECT_EQ(t.open_from("b"), 0);
  EXPECT_EQ(t.admit(c1, "c", "p" + std::to_string(c1), TimePoint{}), Verdict::kAdmitted);
  for (int fd : {a2, a3, c1}) close(fd);
  t.sweep();
  EXPECT_EQ(t.open(), 0);
}

// a descriptor number reused for another socket (or anything else) is not
// the connection it held
TEST(ConnectionTable, AReusedDescriptorIsANewConnection) {
  ConnectionTable t({0, 1});
  const int fd = new_socket();
  ASSERT_EQ(t.admit(fd, "a", "p" + std::to_string(fd), TimePoint{}), Verdict::kAdmitted);
  close(fd);
  const int again = new_socket();  // the lowest free number: the same one
  ASSERT_EQ(again, fd);
  EXPECT_EQ(t.admit(again, "b", "p" + std::to_string(again), TimePoint{}), Verdict::kAdmitted);  // a's entry went with it
  EXPECT_EQ(t.open_from("a"), 0);
  EXPECT_EQ(t.open_from("b"), 1);
  close(again);
  int pipe_fds[2] = {-1, -1};
  ASSERT_EQ(pipe(pipe_fds), 0);  // takes the number again, not a socket
  t.sweep();
  EXPECT_EQ(t.open(), 0);
  EXPECT_EQ(t.admit(pipe_fds[0], "c", "p" + std::to_string(pipe_fds[0]), TimePoint{}), Verdict::kNotASocket);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

// new connections per client: a burst, then a rate; a refusal takes nothing
TEST(ConnectionTable, RationsEachClientsNewConnections) {
  ConnectionCaps caps;
  caps.rate_per_client = 2;
  caps.burst_per_client = 3;
  ConnectionTable t(caps);
  const TimePoint t0{};
  std::vector<int> fds;
  auto admit = [&](const char* client, double at_s) {
    fds.push_back(new_socket());
    return t.admit(fds.back(), client, "p" + std::to_string(fds.back()), t0 + from_seconds(at_s));
  };
  EXPECT_EQ(admit("a", 0), Verdict::kAdmitted);
  EXPECT_EQ(admit("a", 0), Verdict::kAdmitted);
  EXPECT_EQ(admit("a", 0), Verdict::kAdmitted);
  EXPECT_EQ(admit("a", 0), Verdict::kClientRate);
  EXPECT_EQ(admit("a", 0.2), Verdict::kClientRate);  // 0.4 of one back
  EXPECT_EQ(admit("b", 0.2), Verdict::kAdmitted);    // another client has its own
  EXPECT_EQ(admit("a", 0.5), Verdict::kAdmitted);    // refusals took nothing: one back at 0.5 s
  EXPECT_EQ(admit("a", 0.5), Verdict::kClientRate);
  EXPECT_EQ(admit("a", 10), Verdict::kAdmitted);     // refilled to the burst
  EXPECT_EQ(admit("a", 10), Verdict::kAdmitted);
  EXPECT_EQ(admit("a", 10), Verdict::kAdmitted);
  EXPECT_EQ(admit("a", 10), Verdict::kClientRate);   // not beyond it
  EXPECT_EQ(t.open_from("a"), 7);
  for (int fd : fds) close(fd);
}

// a connection past max_calls_per_s calls in one second is shut down (its
// peer sees the end) and its address refused for block_s; the count starts
// afresh each second
TEST(ConnectionTable, AConnectionPastItsCallsIsShutDownAndItsAddressBlocked) {
  ConnectionCaps caps;
  caps.max_calls_per_s = 3;
  caps.block_s = 10;
  ConnectionTable t(caps);
  const TimePoint t0{};
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_EQ(t.admit(pair[0], "a", "ipv4:10.0.0.1:1000", t0), Verdict::kAdmitted);
  std::string client;
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(t.note_call("ipv4:10.0.0.1:1000", t0, &client));
  EXPECT_FALSE(t.note_call("ipv4:10.0.0.1:9999", t0, &client));  // another (unknown) connection
  EXPECT_TRUE(t.note_call("ipv4:10.0.0.1:1000", t0 + from_seconds(0.5), &client));
  EXPECT_EQ(client, "a");
  EXPECT_FALSE(t.note_call("ipv4:10.0.0.1:1000", t0 + from_seconds(0.6), &client));  // once
  char c;
  EXPECT_EQ(recv(pair[1], &c, 1, MSG_DONTWAIT), 0);  // shut down: the other end reads its end
  const int s1 = new_socket(), s2 = new_socket(), s3 = new_socket(), s4 = new_socket();
  EXPECT_EQ(t.admit(s1, "a", "p1", t0 + from_seconds(5)), Verdict::kClientBlocked);
  EXPECT_EQ(t.admit(s2, "b", "p2", t0 + from_seconds(5)), Verdict::kAdmitted);
  EXPECT_EQ(t.admit(s3, "a", "p3", t0 + from_seconds(10.6)), Verdict::kAdmitted);
  // three calls a second, second after second, never pass the limit
  ASSERT_EQ(t.admit(s4, "c", "p4", t0), Verdict::kAdmitted);
  for (int second = 20; second < 23; ++second)
    for (int i = 0; i < 3; ++i) EXPECT_FALSE(t.note_call("p4", t0 + from_seconds(second + 0.1 * i), &client));
  for (int fd : {pair[0], pair[1], s1, s2, s3, s4}) close(fd);
}

int connect_to(int port) {
  const int fd = new_socket();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// true when the peer closed the connection within 5 s
bool closed_by_peer(int fd) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  const ssize_t n = recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST(Listener, HandsOverWhatTheCapsAllowAndClosesTheRest) {
  auto l = Listener::bind("127.0.0.1", 0, {/*max_total=*/0, /*max_per_client=*/2});
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_GT((*l)->port(), 0);
  std::mutex mu;
  std::vector<int> handed;
  std::vector<std::string> refused;
  std::atomic<int> open{-1};
  Listener::Callbacks cb;
  cb.hand_over = [&](int, int fd) {
    std::lock_guard<std::mutex> lk(mu);
    handed.push_back(fd);
  };
  cb.open_changed = [&](int n) { open = n; };
  cb.refused = [&](absl::string_view reason, absl::string_view client) {
    std::lock_guard<std::mutex> lk(mu);
    refused.push_back(std::string(reason) + " " + std::string(client));
  };
  (*l)->start(cb);
  const int c1 = connect_to((*l)->port()), c2 = connect_to((*l)->port());
  ASSERT_GE(c1, 0);
  ASSERT_GE(c2, 0);
  auto handed_count = [&] {
    std::lock_guard<std::mutex> lk(mu);
    return handed.size();
  };
  for (int i = 0; i < 500 && handed_count() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(handed_count(), 2u);
  // the third from the same address is closed at once
  const int c3 = connect_to((*l)->port());
  ASSERT_GE(c3, 0);
  EXPECT_TRUE(closed_by_peer(c3));
  {
    std::lock_guard<std::mutex> lk(mu);
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_EQ(refused[0], "client_cap ipv4:127.0.0.1");
  }
  EXPECT_EQ(handed_count(), 2u);
  // the owner of a handed connection closes it: room again
  {
    std::lock_guard<std::mutex> lk(mu);
    close(handed[0]);
  }
  const int c4 = connect_to((*l)->port());
  for (int i = 0; i < 500 && handed_count() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(handed_count(), 3u);
  EXPECT_EQ(open.load(), 2);
  (*l)->stop();
  EXPECT_LT(connect_to((*l)->port()), 0);  // nobody listens any more
  std::lock_guard<std::mutex> lk(mu);
  for (size_t i = 1; i < handed.size(); ++i) close(handed[i]);
  for (int fd : {c1, c2, c3, c4}) close(fd);
}

TEST(Listener, RefusesATakenPortAndABadHost) {
  auto first = Listener::bind("127.0.0.1", 0, {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Listener::bind("127.0.0.1", (*first)->port(), {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot listen on 127.0.0.1:"), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
  auto bad = Listener::bind("no.such.host.invalid", 0, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  // an IPv6 address in brackets, when the machine has IPv6 loopback
  auto v6 = Listener::bind("[::1]", 0, {});
  if (v6.ok()) {
    EXPECT_GT((*v6)->port(), 0);
  }
}

// a name with an IPv4 and an IPv6 address: one port on both
TEST(Listener, BindsEveryAddressOfANameOnOnePort) {
  addrinfo hints{};
  hints.ai_family = AF_INET6;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const bool has_v6 = getaddrinfo("localhost", "1", &hints, &found) == 0;
  if (found != nullptr) freeaddrinfo(found);
  for (int i = 0; i < 5; ++i) {
    auto l = Listener::bind("localhost", 0, {});
    ASSERT_TRUE(l.ok()) << l.status();
    const int v4 = connect_to((*l)->port());
    EXPECT_GE(v4, 0);
    if (v4 >= 0) close(v4);
    const int v6 = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>((*l)->port()));
    a.sin6_addr = in6addr_loopback;
    // where localhost has ::1 too, it listens there on the same port
    if (has_v6 && v6 >= 0 && connect(v6, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      EXPECT_NE(errno, ECONNREFUSED) << "localhost's IPv6 address is not listening on port " << (*l)->port();
    }
    if (v6 >= 0) close(v6);
  }
}

TEST(Listener, PeerAddressesAsGrpcWritesThem) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr);
  EXPECT_EQ(peer_of_sockaddr(&v4, sizeof v4), "ipv4:10.1.2.3");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "2001:db8::7", &v6.sin6_addr);
  EXPECT_EQ(peer_of_sockaddr(&v6, sizeof v6), "ipv6:[2001:db8::7]");
  inet_pton(AF_INET6, "::ffff:192.0.2.9", &v6.sin6_addr);
  EXPECT_EQ(peer_of_sockaddr(&v6, sizeof v6), "ipv4:192.0.2.9");
  EXPECT_EQ(peer_of_sockaddr(&v4, 2), "unknown");
}

}  // namespace
}  // namespace wm::server
