// The session manager step by step against tables of expected states
// (STYLE.md 7): admission against the KV budget and the caps, release,
// TTL expiry and draining, with no tensors and no clock.
#include "server/session_manager.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace wm::server {
namespace {

using std::chrono::seconds;

SessionManagerConfig config() {
  SessionManagerConfig c;
  c.kv_capacity_bytes = 1000;
  c.reservation_bytes = {{"fp16", 400}, {"q2", 100}};
  c.max_sessions = 5;
  c.max_sessions_per_client = 3;
  c.idle_ttl = seconds(10);
  return c;
}

TEST(SessionManager, AdmissionFollowsTheBudgetAndTheCapsStepByStep) {
  SessionManager m(config());
  const TimePoint t0{};
  struct Step {
    const char* op;            // "admit" or "release"
    const char* client;
    const char* format;
    int release_index;         // for release: which admitted key (by order)
    absl::StatusCode code;     // admit's status
    RejectReason reason;
    int64_t reserved_after;
    int sessions_after;
  };
  const Step steps[] = {
      {"admit", "a", "fp16", 0, absl::StatusCode::kOk, RejectReason::kNone, 400, 1},
      {"admit", "a", "fp16", 0, absl::StatusCode::kOk, RejectReason::kNone, 800, 2},
      // 800 + 400 > 1000: the budget refuses, a smaller format still fits
      {"admit", "b", "fp16", 0, absl::StatusCode::kResourceExhausted, RejectReason::kKvBudget, 800, 2},
      {"admit", "b", "q2", 0, absl::StatusCode::kOk, RejectReason::kNone, 900, 3},
      {"admit", "a", "q2", 0, absl::StatusCode::kOk, RejectReason::kNone, 1000, 4},
      // client a has 3 sessions: its cap, whatever the budget
      {"admit", "a", "q2", 0, absl::StatusCode::kResourceExhausted, RejectReason::kClientCap, 1000, 4},
      {"admit", "c", "nope", 0, absl::StatusCode::kNotFound, RejectReason::kUnknownFormat, 1000, 4},
      {"admit", "c", "q2", 0, absl::StatusCode::kResourceExhausted, RejectReason::kKvBudget, 1000, 4},
      {"release", "", "", 0, absl::StatusCode::kOk, RejectReason::kNone, 600, 3},
      {"admit", "a", "q2", 0, absl::StatusCode::kOk, RejectReason::kNone, 700, 4},
      {"admit", "c", "q2", 0, absl::StatusCode::kOk, RejectReason::kNone, 800, 5},
      // five sessions: the server cap
      {"admit", "d", "q2", 0, absl::StatusCode::kResourceExhausted, RejectReason::kMaxSessions, 800, 5},
  };
  std::vector<SessionManager::Key> keys;
  int i = 0;
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "step " << i++);
    if (std::string(s.op) == "admit") {
      RejectReason reason = RejectReason::kKvBudget;
      auto key = m.admit({s.client, s.format}, t0, &reason);
      EXPECT_EQ(key.status().code(), s.code) << key.status();
      EXPECT_EQ(reason, s.reason);
      if (key.ok()) keys.push_back(*key);
    } else {
      EXPECT_TRUE(m.release(keys[static_cast<size_t>(s.release_index)]));
      EXPECT_FALSE(m.release(keys[static_cast<size_t>(s.release_index)]));  // once only
    }
    EXPECT_EQ(m.reserved_bytes(), s.reserved_after);
    EXPECT_EQ(m.free_bytes(), 1000 - s.reserved_after);
    EXPECT_EQ(m.sessions(), s.sessions_after);
  }
  EXPECT_EQ(m.sessions_of("a"), 3);
  EXPECT_EQ(m.sessions_of("zzz"), 0);
}

TEST(SessionManager, RefusalsSayWhyAndWhatToDo) {
  SessionManager m(config());
  ASSERT_TRUE(m.admit({"a", "fp16"}, {}).ok());
  ASSERT_TRUE(m.admit({"a", "fp16"}, {}).ok());
  auto full = m.admit({"b", "fp16"}, {});
  EXPECT_TRUE(absl::StrContains(full.status().message(), "needs 400 bytes, 200 of 1000 are free"))
      << full.status();
  m.set_draining();
  RejectReason reason;
  auto draining = m.admit({"b", "q2"}, {}, &reason);
  EXPECT_EQ(draining.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reason, RejectReason::kDraining);
  EXPECT_EQ(reject_reason_label(reason), "draining");
}

TEST(SessionManager, AnAuditedSessionReservesItsShadowToo) {
  SessionManagerConfig c = config();
  c.audit_bytes = 300;
  SessionManager m(c);
  AdmitRequest audited{"a", "q2"};
  audited.audit = true;
  auto a = m.admit(audited, {});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(m.reserved_bytes(), 400);  // 100 + the 300-byte shadow
  ASSERT_TRUE(m.admit({"a", "fp16"}, {}).ok());
  EXPECT_EQ(m.reserved_bytes(), 800);
  // 800 + 100 fits, 800 + 100 + 300 does not
  RejectReason reason = RejectReason::kNone;
  auto full = m.admit(audited, {}, &reason);
  EXPECT_EQ(reason, RejectReason::kKvBudget);
  EXPECT_TRUE(absl::StrContains(full.status().message(), "an audited q2 session needs 400 bytes")) << full.status();
  ASSERT_TRUE(m.admit({"b", "q2"}, {}).ok());
  // releasing the audited session returns both
  ASSERT_TRUE(m.release(*a));
  EXPECT_EQ(m.reserved_bytes(), 500);
}

TEST(SessionManager, CanAdmitTracksTheDefaultFormatAndDraining) {
  SessionManager m(config());
  EXPECT_TRUE(m.can_admit("fp16"));
  auto a = m.admit({"a", "fp16"}, {});
  auto b = m.admit({"b", "fp16"}, {});
  EXPECT_FALSE(m.can_admit("fp16"));  // 800 + 400 > 1000
  EXPECT_TRUE(m.can_admit("q2"));
  EXPECT_FALSE(m.can_admit("unknown"));
  m.release(*a);
  EXPECT_TRUE(m.can_admit("fp16"));
  m.set_draining();
  EXPECT_FALSE(m.can_admit("fp16"));
  EXPECT_FALSE(m.can_admit("q2"));
}

TEST(SessionManager, IdleSessionsExpireOnceInOrderOfTheirLastAction) {
  SessionManager m(config());
  const TimePoint t0{};
  auto a = *m.admit({"a", "q2"}, t0);
  auto b = *m.admit({"b", "q2"}, t0 + seconds(1));
  auto c = *m.admit({"c", "q2"}, t0 + seconds(2));
  m.touch(a, t0 + seconds(5));
  struct Step {
    int at_s;
    std::vector<SessionManager::Key> expired;
  };
  const Step steps[] = {
      {9, {}},
      {11, {b}},       // b idle since 1 s
      {12, {c}},       // c idle since 2 s; b reported before, not again
      {14, {}},
      {15, {a}},       // a touched at 5 s
      {30, {}},
  };
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "t = " << s.at_s << " s");
    EXPECT_EQ(m.take_expired(t0 + seconds(s.at_s)), s.expired);
  }
  // expired sessions stay held until released
  EXPECT_EQ(m.sessions(), 3);
  EXPECT_TRUE(m.release(b));
  EXPECT_EQ(m.sessions(), 2);
}

TEST(SessionManager, TouchNeverMovesActivityBackAndZeroTtlNeverExpires) {
  SessionManagerConfig c = config();
  SessionManager m(c);
  const TimePoint t0{};
  auto a = *m.admit({"a", "q2"}, t0 + seconds(8));
  m.touch(a, t0 + seconds(1));  // an out-of-order touch
  EXPECT_TRUE(m.take_expired(t0 + seconds(17)).empty());
  EXPECT_EQ(m.take_expired(t0 + seconds(18)).size(), 1u);
  c.idle_ttl = Duration::zero();
  SessionManager forever(c);
  forever.admit({"a", "q2"}, t0).IgnoreError();
  EXPECT_TRUE(forever.take_expired(t0 + seconds(100000)).empty());
}

TEST(SessionManager, ParkAndResumeStepByStep) {
  SessionManager m(config());  // idle TTL 10 s, park TTL 30 s (the default)
  const TimePoint t0{};
  auto a = *m.admit({"a", "fp16", "tok-a"}, t0);
  auto b = *m.admit({"b", "q2", "tok-b"}, t0);
  auto c = *m.admit({"c", "q2", ""}, t0);  // no token: never parks
  struct Step {
    int at_s;
    const char* op;            // park KEY, unpark TOKEN, expire
    const char* arg;
    bool park_ok;              // park's answer
    absl::StatusCode code;     // unpark's answer
    std::vector<SessionManager::Key> expired;  // take_park_expired's answer
    int parked_after;
  };
  const Step steps[] = {
      {1, "park", "a", true, absl::StatusCode::kOk, {}, 1},
      {2, "park", "a", false, absl::StatusCode::kOk, {}, 1},           // parked already
      {2, "park", "c", false, absl::StatusCode::kOk, {}, 1},           // no token
      {3, "unpark", "tok-b", false, absl::StatusCode::kAlreadyExists, {}, 1},  // b is attached
      {3, "unpark", "bogus", false, absl::StatusCode::kNotFound, {}, 1},
      {3, "unpark", "", false, absl::StatusCode::kNotFound, {}, 1},
      {4, "unpark", "tok-a", false, absl::StatusCode::kOk, {}, 0},
      {4, "unpark", "tok-a", false, absl::StatusCode::kAlreadyExists, {}, 0},  // attached again
      {5, "park", "a", true, absl::StatusCode::kOk, {}, 1},
      {6, "park", "b", true, absl::StatusCode::kOk, {}, 2},
      {34, "expire", "", false, absl::StatusCode::kOk, {}, 2},         // a parked 29 s ago
      {36, "expire", "", false, absl::StatusCode::kOk, {a, b}, 2},     // held until released
      {36, "unpark", "tok-a", false, absl::StatusCode::kNotFound, {}, 2},  // expired: the token is gone
      {37, "expire", "", false, absl::StatusCode::kOk, {}, 2},         // reported once
  };
  const std::map<std::string, SessionManager::Key> keys = {{"a", a}, {"b", b}, {"c", c}};
  int i = 0;
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "step " << i++ << ": " << s.op << " " << s.arg);
    const TimePoint now = t0 + seconds(s.at_s);
    const std::string op = s.op;
    if (op == "park") {
      EXPECT_EQ(m.park(keys.at(s.arg), now), s.park_ok);
    } else if (op == "unpark") {
      auto key = m.unpark(s.arg, now);
      EXPECT_EQ(key.status().code(), s.code) << key.status();
      if (key.ok()) {
        EXPECT_EQ(*key, keys.at("a"));
      }
    } else {
      EXPECT_EQ(m.take_park_expired(now), s.expired);
    }
    EXPECT_EQ(m.parked(), s.parked_after);
    EXPECT_EQ(m.sessions(), 3);                // parking keeps the session
    EXPECT_EQ(m.reserved_bytes(), 400 + 200);  // and its reservation
  }
  EXPECT_TRUE(m.release(a));
  EXPECT_TRUE(m.release(b));
  EXPECT_EQ(m.parked(), 0);
  EXPECT_EQ(m.reserved_bytes(), 100);
}

TEST(SessionManager, ParkedSessionsDoNotIdleOutAndResumeRestartsTheIdleClock) {
  SessionManager m(config());  // idle TTL 10 s
  const TimePoint t0{};
  auto a = *m.admit({"a", "q2", "tok"}, t0);
  ASSERT_TRUE(m.park(a, t0 + seconds(1)));
  EXPECT_TRUE(m.take_expired(t0 + seconds(20)).empty());  // parked: the park TTL decides
  ASSERT_TRUE(m.unpark("tok", t0 + seconds(20)).ok());
  EXPECT_TRUE(m.take_expired(t0 + seconds(29)).empty());
  EXPECT_EQ(m.take_expired(t0 + seconds(30)), std::vector<SessionManager::Key>{a});
  // an idle-expired session is on its way out: it cannot park
  EXPECT_FALSE(m.park(a, t0 + seconds(31)));
}

// a reload of the API tokens takes every session, open or parked, whose
// credential the new table lacks, once; sessions without one are never taken
TEST(SessionManager, RevokedCredentialsTakeOpenAndParkedSessionsOnce) {
  SessionManager m(config());
  const TimePoint t0{};
  auto with = [&](const char* token, const char* credential) {
    AdmitRequest r{"user:x", "q2", token};
    r.credential = credential;
    return *m.admit(r, t0);
  };
  const auto open_a = with("ta", "A"), parked_a = with("tb", "A"), open_b = with("tc", "B");
  const auto anonymous = *m.admit({"ipv4:1.2.3.4", "q2", "td"}, t0);
  ASSERT_TRUE(m.park(parked_a, t0));
  auto holds_b = [](const std::string& c) { return c == "B"; };
  EXPECT_EQ(m.take_revoked(holds_b), (std::vector<SessionManager::Key>{open_a, parked_a}));
  EXPECT_TRUE(m.take_revoked(holds_b).empty());                  // reported once
  EXPECT_EQ(m.unpark("tb", t0).status().code(), absl::StatusCode::kNotFound);  // its resume token is gone
  EXPECT_FALSE(m.park(open_a, t0));                               // on its way out: it cannot park
  EXPECT_EQ(m.sessions(), 4);                                     // held until released
  // a session without a credential (no tokens when it started) is never taken
  EXPECT_EQ(m.take_revoked([](const std::string&) { return false; }), std::vector<SessionManager::Key>{open_b});
  EXPECT_EQ(m.take_expired(t0 + seconds(60)), std::vector<SessionManager::Key>{anonymous});
  EXPECT_TRUE(m.release(open_a) && m.release(parked_a));
  EXPECT_EQ(m.parked(), 0);
}

TEST(SessionManager, NoParkingWhenOffOrDrainingAndDrainingTakesTheParked) {
  SessionManagerConfig off = config();
  off.park_ttl = Duration::zero();
  SessionManager m0(off);
  auto k = *m0.admit({"a", "q2", "tok"}, {});
  EXPECT_FALSE(m0.park(k, {}));

  SessionManager m(config());
  auto a = *m.admit({"a", "q2", "ta"}, {});
  auto b = *m.admit({"a", "q2", "tb"}, {});
  ASSERT_TRUE(m.park(a, {}));
  m.set_draining();
  EXPECT_FALSE(m.park(b, {}));
  EXPECT_EQ(m.unpark("ta", {}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m.take_parked(), std::vector<SessionManager::Key>{a});
  EXPECT_TRUE(m.take_parked().empty());
  EXPECT_EQ(m.sessions(), 2);  // held until released
  EXPECT_TRUE(m.release(a));
  EXPECT_EQ(m.parked(), 0);
}

TEST(SessionManager, PromptFramesComeOutOfEachClientsBucketStepByStep) {
  SessionManagerConfig c = config();
  c.max_sessions = 0;
  c.max_sessions_per_client = 0;
  c.kv_capacity_bytes = 100000;
  c.client_prompt_rate = 2;  // frames a second
  c.client_prompt_burst = 8;
  SessionManager m(c);
  const TimePoint t0{};
  struct Step {
    double at_s;
    const char* client;
    int prompt_frames;
    absl::StatusCode code;
    double a_left_after;  // client a's frames left after the step
  };
  const Step steps[] = {
      {0, "a", 8, absl::StatusCode::kOk, 0},                   // the whole burst at once
      {0, "a", 0, absl::StatusCode::kOk, 0},                   // a Start without a prompt costs nothing
      {0, "a", 1, absl::StatusCode::kResourceExhausted, 0},    // nothing left
      {0, "b", 8, absl::StatusCode::kOk, 0},                   // another client has its own bucket
      {1.5, "a", 4, absl::StatusCode::kResourceExhausted, 3},  // 3 refilled, a refusal takes nothing
      {1.5, "a", 3, absl::StatusCode::kOk, 0},
      {100, "a", 1, absl::StatusCode::kOk, 7},                 // refilled to the burst, not beyond
      {99, "a", 7, absl::StatusCode::kOk, 0},                  // a clock that went back refills nothing
  };
  int i = 0;
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "step " << i++);
    const TimePoint now = t0 + from_seconds(s.at_s);
    AdmitRequest r{s.client, "q2"};
    r.prompt_frames = s.prompt_frames;
    RejectReason reason = RejectReason::kNone;
    auto key = m.admit(r, now, &reason);
    EXPECT_EQ(key.status().code(), s.code) << key.status();
    EXPECT_EQ(reason, s.code == absl::StatusCode::kOk ? RejectReason::kNone : RejectReason::kPromptRate);
    EXPECT_DOUBLE_EQ(m.prompt_frames_left("a", now), s.a_left_after);
  }
  EXPECT_EQ(reject_reason_label(RejectReason::kPromptRate), "prompt_rate");
}

TEST(SessionManager, APromptRefusalSaysWhenToRetryAndOtherRefusalsTakeNoFrames) {
  SessionManagerConfig c = config();
  c.client_prompt_rate = 0.5;
  c.client_prompt_burst = 4;
  SessionManager m(c);
  AdmitRequest r{"ipv4:10.0.0.1", "q2"};
  r.prompt_frames = 3;
  ASSERT_TRUE(m.admit(r, {}).ok());
  auto refused = m.admit(r, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  // 1 frame left, 3 needed: 2 more at 0.5 a second
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "client ipv4:10.0.0.1: Starts and their prompt frames come faster than 0.5 a "
                                "second (--client_prompt_rate): this Start costs 3 (its prompt frames, at least "
                                "one), 1 are left; retry in 4.0 s"))
      << refused.status();
  // refused by the budget or a cap: the prompt frames stay with the client
  AdmitRequest big{"c", "fp16"};
  big.prompt_frames = 2;
  ASSERT_TRUE(m.admit(big, {}).ok());
  ASSERT_TRUE(m.admit(big, {}).ok());
  EXPECT_DOUBLE_EQ(m.prompt_frames_left("c", {}), 0);
  AdmitRequest d{"d", "fp16"};
  d.prompt_frames = 4;
  RejectReason reason = RejectReason::kNone;
  EXPECT_FALSE(m.admit(d, {}, &reason).ok());
  EXPECT_EQ(reason, RejectReason::kKvBudget);
  EXPECT_DOUBLE_EQ(m.prompt_frames_left("d", {}), 4);
  // with the rate off, nothing is counted
  SessionManager off(config());
  AdmitRequest many{"e", "q2"};
  many.prompt_frames = 1000;
  ASSERT_TRUE(off.admit(many, {}).ok());
  EXPECT_EQ(off.prompt_buckets(), 0);
}

TEST(SessionManager, OnlyClientsStillRefillingAreRemembered) {
  SessionManagerConfig c = config();
  c.max_sessions = 0;
  c.max_sessions_per_client = 0;
  c.kv_capacity_bytes = int64_t{1} << 40;
  c.client_prompt_rate = 1;
  c.client_prompt_burst = 2;
  SessionManager m(c);
  const TimePoint t0{};
  // a thousand clients, one a second: each refills within two seconds, so
  // a sweep keeps two, and the map never grows past its first sweep size
  // (however many came before)
  for (int i = 0; i < 1000; ++i) {
    AdmitRequest r{"client" + std::to_string(i), "q2"};
    r.prompt_frames = 2;
    ASSERT_TRUE(m.admit(r, t0 + seconds(i)).ok()) << i;
    // swept when the map reaches 64 (the sweep leaves 2): at most 64 at any time
    EXPECT_LE(m.prompt_buckets(), 64) << i;
  }
  EXPECT_DOUBLE_EQ(m.prompt_frames_left("client999", t0 + seconds(999)), 0);
  EXPECT_DOUBLE_EQ(m.prompt_frames_left("client998", t0 + seconds(999)), 1);
}

TEST(SessionManager, AResumeForOneClientFindsOnlyItsSessions) {
  SessionManager m(config());
  AdmitRequest r{"user:alice", "q2"};
  r.resume_token = "ta";
  const auto a = *m.admit(r, {});
  ASSERT_TRUE(m.park(a, {}));
  // another user's resume: as if the token were unknown, and the session stays parked
  auto other = m.unpark("ta", {}, "user:bob");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.parked(), 1);
  EXPECT_EQ(*m.unpark("ta", {}, "user:alice"), a);
  ASSERT_TRUE(m.park(a, {}));
  EXPECT_EQ(*m.unpark("ta", {}), a);  // no client given: anyone with the token
}

TEST(SessionManager, PeerAddressesLoseTheirPort) {
  EXPECT_EQ(client_of_peer("ipv4:127.0.0.1:5555"), "ipv4:127.0.0.1");
  EXPECT_EQ(client_of_peer("ipv6:[::1]:5555"), "ipv6:[::1]");
  // gRPC 1.51 writes its peer as a URI: the brackets percent-encoded
  EXPECT_EQ(client_of_peer("ipv6:%5B::1%5D:5555"), "ipv6:[::1]");
  EXPECT_EQ(client_group(client_of_peer("ipv6:%5B2001:db8:1:2::7%5D:443")), "ipv6:[2001:db8:1:2::]/64");
  EXPECT_EQ(peer_text("ipv6:%5Bfe80::1%25eth0%5D:5555"), "ipv6:[fe80::1%eth0]:5555");
  EXPECT_EQ(peer_text("ipv4:10.0.0.1:80"), "ipv4:10.0.0.1:80");
  EXPECT_EQ(peer_text("odd%zz%5"), "odd%zz%5");  // not an escape: as it is
  EXPECT_EQ(client_of_peer("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(client_of_peer(""), "");
}

TEST(SessionManager, IPv6ClientsCountByTheirSlash64) {
  EXPECT_EQ(client_group("ipv6:[2001:db8:1:2:aaaa:bbbb:cccc:dddd]"), "ipv6:[2001:db8:1:2::]/64");
  EXPECT_EQ(client_group("ipv6:[2001:db8:1:2::7]"), "ipv6:[2001:db8:1:2::]/64");
  EXPECT_EQ(client_group("ipv6:[fe80::1%eth0]"), "ipv6:[fe80::]/64");
  EXPECT_EQ(client_group("ipv6:[::1]"), "ipv6:[::]/64");
  EXPECT_EQ(client_group("ipv6:[::ffff:10.0.0.5]"), "ipv6:[::ffff:10.0.0.5]");  // IPv4, mapped
  EXPECT_EQ(client_group("ipv4:10.0.0.5"), "ipv4:10.0.0.5");
  EXPECT_EQ(client_group("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(client_group("ipv6:[not an address]"), "ipv6:[not an address]");
  EXPECT_EQ(client_group(""), "");
}

}  // namespace
}  // namespace wm::server
