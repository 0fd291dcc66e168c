// Admission and lifetime bookkeeping of sessions: the KV byte budget, the
// caps on sessions (in all and per client), the idle TTL, draining, and
// parking: a session whose stream broke keeps its reservation for a while
// and can be re-attached to a new stream with its resume token.
//
// Pure code (STYLE.md 7): no gRPC, no tensors, no clock of its own (callers
// pass `now`), unit-tested step by step in tests/server/session_manager_test.cc.
// It mirrors the engine's own admission (Engine::session_reservation against
// Engine::kv_capacity_bytes) so that a gRPC thread can admit or refuse a
// session without asking the engine thread.
//
// Threading: not thread-safe; the service holds one mutex around it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/clock.h"
#include "server/rate_buckets.h"

namespace wm::server {

// why a session was refused (the label of wm_sessions_rejected_total)
enum class RejectReason { kNone, kDraining, kKvBudget, kMaxSessions, kClientCap, kUnknownFormat, kPromptRate };
absl::string_view reject_reason_label(RejectReason r);

struct SessionManagerConfig {
  int64_t kv_capacity_bytes = 0;            // the engine's KV budget
  std::map<std::string, int64_t> reservation_bytes;  // per cache format: what one session reserves
  int64_t audit_bytes = 0;                  // what an audited session reserves on top (its shadow)
  int max_sessions = 64;                    // 0: no cap besides the KV budget
  int max_sessions_per_client = 16;         // 0: no per-client cap
  Duration idle_ttl = std::chrono::seconds(60);  // zero: sessions never expire
  Duration park_ttl = std::chrono::seconds(30);  // how long a parked session waits; zero: never park
  // Starts per client: a Start costs its prompt frames (engine passes before
  // the session's first frame), at least one; a bucket of
  // client_prompt_burst, refilled at client_prompt_rate a second; a rate of
  // 0: no limit
  double client_prompt_rate = 0;
  int client_prompt_burst = 32;
};

struct AdmitRequest {
  std::string client;        // the peer's address without the port
  std::string cache_format;
  std::string resume_token = "";  // "" = not resumable; otherwise unique among held sessions
  bool audit = false;             // keeps a full-precision shadow: reserves audit_bytes more
  int prompt_frames = 0;          // what the Start costs the client's bucket (its prompt frames, at least one)
  std::string credential = "";    // the API token the session was started with (its digest); "" without tokens
};

class SessionManager {
 public:
  using Key = uint64_t;  // server-side session key, never reused

  explicit SessionManager(SessionManagerConfig config);

  // reserves the session's KV bytes and takes its prompt frames from the
  // client's bucket; on refusal the status says why (UNAVAILABLE while
  // draining, RESOURCE_EXHAUSTED when full or when the client's prompt frames
  // come too fast, NOT_FOUND for an unknown format) and *reason names it for
  // metrics
  absl::StatusOr<Key> admit(const AdmitRequest& request, TimePoint now, RejectReason* reason = nullptr);
  // frees the session's reservation; false if the key is not held
  bool release(Key key);
  // records client activity (an action) so the session does not expire
  void touch(Key key, TimePoint now);
  // sessions idle for at least the TTL that were not reported before, oldest
  // activity first; they stay held until released (the engine frees their
  // cache first)
  std::vector<Key> take_expired(TimePoint now);

  // the session's stream ended without a purposeful close: keep it (and its
  // reservation) for park_ttl. False (and nothing changes) when parking is
  // off, while draining, or when the key is not held, already parked or expired.
  bool can_park(Key key) const;
  bool park(Key key, TimePoint now);
  // the parked session of a resume token, attached again (its idle clock
  // restarts at `now`): NOT_FOUND for an unknown or expired token,
  // ALREADY_EXISTS when its session is attached to a live stream,
  // UNAVAILABLE while draining. With only_client set, a session admitted for
  // another client answers NOT_FOUND too (with API tokens: another user's)
  absl::StatusOr<Key> unpark(absl::string_view token, TimePoint now, absl::string_view only_client = "");
  // sessions parked for at least park_ttl, oldest first; their tokens stop
  // working at once, and they stay held until released
  std::vector<Key> take_park_expired(TimePoint now);
  // every parked session (draining closes them); their tokens stop working
  std::vector<Key> take_parked();
  // sessions, open or parked, started with an API token that `holds` no
  // longer accepts (a reload revoked it), oldest first; their resume tokens
  // stop working at once, and they stay held until released
  std::vector<Key> take_revoked(const std::function<bool(const std::string& credential)>& holds);
  int parked() const { return parked_; }

  void set_draining() { draining_ = true; }
  bool draining() const { return draining_; }
  // whether a session of this format would be admitted now from a new client
  bool can_admit(absl::string_view cache_format) const;

  int64_t capacity_bytes() const { return config_.kv_capacity_bytes; }
  int64_t reserved_bytes() const { return reserved_; }
  int64_t free_bytes() const { return config_.kv_capacity_bytes - reserved_; }
  int sessions() const { return static_cast<int>(sessions_.size()); }
  int sessions_of(absl::string_view client) const;
  // whether the client may send prompt_frames now: RESOURCE_EXHAUSTED, saying
  // when to retry, if not (admit checks it too; this takes nothing)
  absl::Status check_prompt_frames(absl::string_view client, int prompt_frames, TimePoint now) const;
  // the prompt frames a client may send now (client_prompt_burst when the rate is off)
  double prompt_frames_left(absl::string_view client, TimePoint now) const;
  // charges `prompt_frames` to the client's Start ration without admitting
  // anything: a Start refused after its prompt JPEGs were decoded
  void charge_prompt_frames(absl::string_view client, int prompt_frames, TimePoint now);
  // clients whose bucket is not full (the others are not stored)
  int prompt_buckets() const { return static_cast<int>(prompt_frames_.stored()); }
  const SessionManagerConfig& config() const { return config_; }

 private:
  // what the request's session reserves: its format's bytes, plus the shadow's when audited
  int64_t reservation(const AdmitRequest& r) const {
    return config_.reservation_bytes.at(r.cache_format) + (r.audit ? config_.audit_bytes : 0);
  }
  struct Entry {
    std::string client;
    int64_t reserved = 0;
    TimePoint last_activity;
    bool expired = false;   // reported by take_expired or take_park_expired
    std::string token;      // "" once the token stopped working
    bool parked = false;
    TimePoint parked_since;
    std::string credential;  // AdmitRequest::credential
  };
  void forget_token(Entry& e);
  absl::Status check(const AdmitRequest& request, TimePoint now, RejectReason* reason) const;

  SessionManagerConfig config_;
  std::map<Key, Entry> sessions_;
  std::map<std::string, int, std::less<>> per_client_;
  std::map<std::string, Key, std::less<>> tokens_;
  RateBuckets prompt_frames_;  // each client's Start ration
  int parked_ = 0;
  int64_t reserved_ = 0;
  Key next_key_ = 1;
  bool draining_ = false;
};

// gRPC's peer text (a URI: "ipv6:%5B::1%5D:5555") percent-decoded, as the
// address is written ("ipv6:[::1]:5555"); other text as it is
std::string peer_text(absl::string_view grpc_peer);
// the peer without its port, decoded: "ipv4:127.0.0.1:5555" -> "ipv4:127.0.0.1",
// "ipv6:%5B::1%5D:5555" (gRPC 1.51's form) or "ipv6:[::1]:5555" -> "ipv6:[::1]"
std::string client_of_peer(absl::string_view grpc_peer);
// what the per-client caps count for an address (without API tokens): an
// IPv6 address by its /64, which one subscriber gets whole (so 2^64
// addresses to rotate through), "ipv6:[2001:db8:1:2::]/64"; any other
// address (IPv4, IPv4-mapped IPv6, unix sockets) as it is
std::string client_group(absl::string_view client);

}  // namespace wm::server
