#include "server/session_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace wm::server {

absl::string_view reject_reason_label(RejectReason r) {
  switch (r) {
    case RejectReason::kNone: return "none";
    case RejectReason::kDraining: return "draining";
    case RejectReason::kKvBudget: return "kv_budget";
    case RejectReason::kMaxSessions: return "max_sessions";
    case RejectReason::kClientCap: return "client_cap";
    case RejectReason::kUnknownFormat: return "unknown_format";
  }
  return "unknown";
}

SessionManager::SessionManager(SessionManagerConfig config) : config_(std::move(config)) {
  WM_CHECK(config_.kv_capacity_bytes > 0);
  WM_CHECK(config_.max_sessions >= 0 && config_.max_sessions_per_client >= 0);
  for (const auto& [format, bytes] : config_.reservation_bytes) WM_CHECK(bytes > 0);
}

int SessionManager::sessions_of(absl::string_view client) const {
  auto it = per_client_.find(client);
  return it == per_client_.end() ? 0 : it->second;
}

absl::Status SessionManager::check(const AdmitRequest& request, RejectReason* reason) const {
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
                  absl::NotFoundError(absl::StrCat("unknown cache format '", request.cache_format, "'")));
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
  if (reserved_ + fmt->second > config_.kv_capacity_bytes)
    return refuse(RejectReason::kKvBudget,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "KV cache budget full: a ", request.cache_format, " session needs ", fmt->second, " bytes, ",
                      free_bytes(), " of ", config_.kv_capacity_bytes, " are free (", sessions(),
                      " sessions); try a smaller cache format or later")));
  if (reason != nullptr) *reason = RejectReason::kNone;
  return absl::OkStatus();
}

absl::StatusOr<SessionManager::Key> SessionManager::admit(const AdmitRequest& request, TimePoint now,
                                                          RejectReason* reason) {
  WM_RETURN_IF_ERROR(check(request, reason));
  const int64_t need = config_.reservation_bytes.at(request.cache_format);
  const Key key = next_key_++;
  sessions_.emplace(key, Entry{request.client, need, now, false});
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
    if (!e.expired && now - e.last_activity >= config_.idle_ttl) {
      e.expired = true;
      out.emplace_back(e.last_activity, key);
    }
  }
  std::sort(out.begin(), out.end());
  std::vector<Key> keys;
  for (const auto& [t, k] : out) keys.push_back(k);
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

std::string client_of_peer(absl::string_view peer) {
  // unix sockets and unknown forms are their own client
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  if (colon == absl::string_view::npos || colon == first) return std::string(peer);
  if (peer.substr(0, first) != "ipv4" && peer.substr(0, first) != "ipv6") return std::string(peer);
  return std::string(peer.substr(0, colon));
}

}  // namespace wm::server
