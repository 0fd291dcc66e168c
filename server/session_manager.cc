#include "server/session_manager.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/number_text.h"
#include "common/status_macros.h"
#include "server/client_text.h"

namespace wm::server {

absl::string_view reject_reason_label(RejectReason r) {
  switch (r) {
    case RejectReason::kNone: return "none";
    case RejectReason::kDraining: return "draining";
    case RejectReason::kKvBudget: return "kv_budget";
    case RejectReason::kMaxSessions: return "max_sessions";
    case RejectReason::kClientCap: return "client_cap";
    case RejectReason::kUnknownFormat: return "unknown_format";
    case RejectReason::kPromptRate: return "prompt_rate";
  }
  return "unknown";
}

SessionManager::SessionManager(SessionManagerConfig config)
    : config_(std::move(config)), prompt_frames_(config_.client_prompt_rate, config_.client_prompt_burst) {
  WM_CHECK(config_.kv_capacity_bytes > 0);
  WM_CHECK(config_.max_sessions >= 0 && config_.max_sessions_per_client >= 0);
  for (const auto& [format, bytes] : config_.reservation_bytes) WM_CHECK(bytes > 0);
  WM_CHECK(config_.client_prompt_rate >= 0 && config_.client_prompt_burst >= 0);
}

int SessionManager::sessions_of(absl::string_view client) const {
  auto it = per_client_.find(client);
  return it == per_client_.end() ? 0 : it->second;
}

double SessionManager::prompt_frames_left(absl::string_view client, TimePoint now) const {
  return prompt_frames_.left(client, now);
}

void SessionManager::charge_prompt_frames(absl::string_view client, int prompt_frames, TimePoint now) {
  prompt_frames_.take(client, prompt_frames, now);
}

absl::Status SessionManager::check_prompt_frames(absl::string_view client, int prompt_frames, TimePoint now) const {
  if (config_.client_prompt_rate <= 0 || prompt_frames <= 0) return absl::OkStatus();
  const double left = prompt_frames_left(client, now);
  if (left >= prompt_frames) return absl::OkStatus();
  const double wait_s = (prompt_frames - left) / config_.client_prompt_rate;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "client %s: Starts and their prompt frames come faster than %s a second (--client_prompt_rate): this Start "
      "costs %d (its prompt frames, at least one), %d are left; retry in %.1f s",
      client, exact_text(config_.client_prompt_rate), prompt_frames, std::max(0, static_cast<int>(left)),
      std::max(0.1, std::ceil(wait_s * 10) / 10)));
}

absl::Status SessionManager::check(const AdmitRequest& request, TimePoint now, RejectReason* reason) const {
  auto refuse = [&](RejectReason r, absl::Status st) {
    if (reason != nullptr) *reason = r;
    return st;
  };
  if (draining_)
    return refuse(RejectReason::kDraining,
                  absl::UnavailableError("the server is shutting down and admits no new sessions; try another replica"));
  auto fmt = config_.reservation_bytes.find(request.cache_format);
  if (fmt == config_.reservation_bytes.end())
    return refuse(RejectReason::kUnknownFormat,
                  absl::NotFoundError(absl::StrCat("unknown cache format '", client_text(request.cache_format), "'")));
  if (config_.max_sessions > 0 && sessions() >= config_.max_sessions)
    return refuse(RejectReason::kMaxSessions,
                  absl::ResourceExhaustedError(absl::StrCat("the server is full: ", sessions(), " of ",
                                                            config_.max_sessions, " sessions (--max_sessions)")));
  if (config_.max_sessions_per_client > 0 && sessions_of(request.client) >= config_.max_sessions_per_client)
    return refuse(RejectReason::kClientCap,
                  absl::ResourceExhaustedError(absl::StrCat("client ", request.client, " already has ",
                                                            sessions_of(request.client), " sessions, the cap is ",
                                                            config_.max_sessions_per_client,
                                                            " (--max_sessions_per_client)")));
  if (absl::Status st = check_prompt_frames(request.client, request.prompt_frames, now); !st.ok())
    return refuse(RejectReason::kPromptRate, st);
  if (reserved_ + reservation(request) > config_.kv_capacity_bytes)
    return refuse(RejectReason::kKvBudget,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "KV cache budget full: a", request.audit ? "n audited " : " ", request.cache_format,
                      " session needs ", reservation(request), " bytes, ",
                      free_bytes(), " of ", config_.kv_capacity_bytes, " are free (", sessions(),
                      " sessions); try a smaller cache format or later")));
  if (reason != nullptr) *reason = RejectReason::kNone;
  return absl::OkStatus();
}

absl::StatusOr<SessionManager::Key> SessionManager::admit(const AdmitRequest& request, TimePoint now,
                                                          RejectReason* reason) {
  WM_RETURN_IF_ERROR(check(request, now, reason));
  prompt_frames_.take(request.client, request.prompt_frames, now);
  const int64_t need = reservation(request);
  WM_CHECK(request.resume_token.empty() || tokens_.count(request.resume_token) == 0);
  const Key key = next_key_++;
  Entry e;
  e.client = request.client;
  e.reserved = need;
  e.last_activity = now;
  e.token = request.resume_token;
  e.credential = request.credential;
  if (!e.token.empty()) tokens_.emplace(e.token, key);
  sessions_.emplace(key, std::move(e));
  ++per_client_[request.client];
  reserved_ += need;
  return key;
}

bool SessionManager::release(Key key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return false;
  reserved_ -= it->second.reserved;
  auto pc = per_client_.find(it->second.client);
  WM_CHECK(pc != per_client_.end() && pc->second > 0);
  if (--pc->second == 0) per_client_.erase(pc);
  forget_token(it->second);
  if (it->second.parked) --parked_;
  sessions_.erase(it);
  WM_CHECK(reserved_ >= 0);
  return true;
}

void SessionManager::touch(Key key, TimePoint now) {
  auto it = sessions_.find(key);
  if (it != sessions_.end()) it->second.last_activity = std::max(it->second.last_activity, now);
}

std::vector<SessionManager::Key> SessionManager::take_expired(TimePoint now) {
  std::vector<std::pair<TimePoint, Key>> out;
  if (config_.idle_ttl <= Duration::zero()) return {};
  for (auto& [key, e] : sessions_) {
    // a parked session has no stream to be idle on: park_ttl decides
    if (!e.expired && !e.parked && now - e.last_activity >= config_.idle_ttl) {
      e.expired = true;
      out.emplace_back(e.last_activity, key);
    }
  }
  std::sort(out.begin(), out.end());
  std::vector<Key> keys;
  for (const auto& [t, k] : out) keys.push_back(k);
  return keys;
}

void SessionManager::forget_token(Entry& e) {
  if (!e.token.empty()) tokens_.erase(e.token);
  e.token.clear();
}

bool SessionManager::can_park(Key key) const {
  if (draining_ || config_.park_ttl <= Duration::zero()) return false;
  auto it = sessions_.find(key);
  return it != sessions_.end() && !it->second.parked && !it->second.expired && !it->second.token.empty();
}

bool SessionManager::park(Key key, TimePoint now) {
  if (!can_park(key)) return false;
  Entry& e = sessions_.at(key);
  e.parked = true;
  e.parked_since = now;
  ++parked_;
  return true;
}

absl::StatusOr<SessionManager::Key> SessionManager::unpark(absl::string_view token, TimePoint now,
                                                           absl::string_view only_client) {
  if (draining_)
    return absl::UnavailableError("the server is shutting down and resumes no sessions; start a new one elsewhere");
  auto t = token.empty() ? tokens_.end() : tokens_.find(token);
  // another client's session answers as an unknown token: it says nothing about it
  if (t != tokens_.end() && !only_client.empty() && sessions_.at(t->second).client != only_client) t = tokens_.end();
  if (t == tokens_.end())
    return absl::NotFoundError(
        "unknown or expired resume token: the session ended, its park TTL (--park_ttl_s) ran out, or it belongs to "
        "another server process; start a new session");
  Entry& e = sessions_.at(t->second);
  if (!e.parked)
    return absl::AlreadyExistsError(
        "the session of this resume token is attached to a live stream; a session is resumed only after its "
        "stream ended (cancel that stream first)");
  e.parked = false;
  --parked_;
  e.last_activity = std::max(e.last_activity, now);
  return t->second;
}

std::vector<SessionManager::Key> SessionManager::take_park_expired(TimePoint now) {
  std::vector<std::pair<TimePoint, Key>> out;
  for (auto& [key, e] : sessions_) {
    if (e.parked && !e.expired && now - e.parked_since >= config_.park_ttl) {
      e.expired = true;
      forget_token(e);
      out.emplace_back(e.parked_since, key);
    }
  }
  std::sort(out.begin(), out.end());
  std::vector<Key> keys;
  for (const auto& [t, k] : out) keys.push_back(k);
  return keys;
}

std::vector<SessionManager::Key> SessionManager::take_revoked(
    const std::function<bool(const std::string& credential)>& holds) {
  std::vector<Key> keys;  // keys grow with admission: oldest first
  for (auto& [key, e] : sessions_) {
    if (!e.expired && !e.credential.empty() && !holds(e.credential)) {
      e.expired = true;
      forget_token(e);
      keys.push_back(key);
    }
  }
  return keys;
}

std::vector<SessionManager::Key> SessionManager::take_parked() {
  std::vector<Key> keys;
  for (auto& [key, e] : sessions_) {
    if (e.parked && !e.expired) {
      e.expired = true;
      forget_token(e);
      keys.push_back(key);
    }
  }
  return keys;
}

bool SessionManager::can_admit(absl::string_view cache_format) const {
  // a client with no session yet: the per-client cap does not apply
  if (draining_) return false;
  auto fmt = config_.reservation_bytes.find(std::string(cache_format));
  if (fmt == config_.reservation_bytes.end()) return false;
  if (config_.max_sessions > 0 && sessions() >= config_.max_sessions) return false;
  return reserved_ + fmt->second <= config_.kv_capacity_bytes;
}

std::string peer_text(absl::string_view grpc_peer) {
  std::string out;
  out.reserve(grpc_peer.size());
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  for (size_t i = 0; i < grpc_peer.size(); ++i) {
    if (grpc_peer[i] == '%' && i + 2 < grpc_peer.size() && hex(grpc_peer[i + 1]) >= 0 && hex(grpc_peer[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(grpc_peer[i + 1]) * 16 + hex(grpc_peer[i + 2])));
      i += 2;
    } else {
      out.push_back(grpc_peer[i]);
    }
  }
  return out;
}

std::string client_of_peer(absl::string_view grpc_peer) {
  const std::string text = peer_text(grpc_peer);
  const absl::string_view peer = text;
  // unix sockets and unknown forms are their own client
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon == absl::string_view::npos || colon == first) return std::string(peer);
  if (peer.substr(0, first) != "ipv4" && peer.substr(0, first) != "ipv6") return std::string(peer);
  return std::string(peer.substr(0, colon));
}

std::string client_group(absl::string_view client) {
  absl::string_view inner = client;
  if (!absl::ConsumePrefix(&inner, "ipv6:[") || !absl::ConsumeSuffix(&inner, "]")) return std::string(client);
  std::string text(inner.substr(0, inner.find('%')));  // without a zone
  in6_addr a;
  if (inet_pton(AF_INET6, text.c_str(), &a) != 1 || IN6_IS_ADDR_V4MAPPED(&a)) return std::string(client);
  std::memset(a.s6_addr + 8, 0, 8);
  char out[INET6_ADDRSTRLEN];
  if (inet_ntop(AF_INET6, &a, out, sizeof out) == nullptr) return std::string(client);
  return absl::StrCat("ipv6:[", out, "]/64");
}

}  // namespace wm::server
