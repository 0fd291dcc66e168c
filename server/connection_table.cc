#include "server/connection_table.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>

namespace wm::server {

bool ConnectionTable::still_open(int fd, const Entry& e) const {
  struct stat st;
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == e.inode && st.st_dev == e.device;
}

void ConnectionTable::forget(std::map<int, Entry>::iterator it) {
  auto pc = per_client_.find(it->second.client);
  if (pc != per_client_.end()) {
    pc->second.erase(it->first);
    if (pc->second.empty()) per_client_.erase(pc);
  }
  auto bp = fd_by_peer_.find(it->second.peer);
  if (bp != fd_by_peer_.end() && bp->second == it->first) fd_by_peer_.erase(bp);
  by_fd_.erase(it);
}

void ConnectionTable::sweep() {
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    auto next = std::next(it);
    if (!still_open(it->first, it->second)) forget(it);
    it = next;
  }
}

void ConnectionTable::sweep_client(const std::string& client) {
  auto pc = per_client_.find(client);
  if (pc == per_client_.end()) return;
  const std::set<int> fds = pc->second;  // forget() edits the set
  for (int fd : fds)
    if (auto it = by_fd_.find(fd); it != by_fd_.end() && !still_open(fd, it->second)) forget(it);
}

ConnectionTable::Verdict ConnectionTable::admit(int fd, const std::string& client, const std::string& peer,
                                                TimePoint now) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return Verdict::kNotASocket;
  // the descriptor is ours again: whatever it held before is closed
  if (auto it = by_fd_.find(fd); it != by_fd_.end()) forget(it);
  if (auto b = blocked_until_.find(client); b != blocked_until_.end()) {
    if (now < b->second) return Verdict::kClientBlocked;
    blocked_until_.erase(b);
  }
  if (rate_.limited() && rate_.left(client, now) < 1) return Verdict::kClientRate;
  if (caps_.max_per_client > 0 && open_from(client) >= caps_.max_per_client) sweep_client(client);
  if (caps_.max_total > 0 && open() >= caps_.max_total &&
      (!last_full_sweep_ || now - *last_full_sweep_ >= std::chrono::milliseconds(100))) {
    sweep();
    last_full_sweep_ = now;
  }
  if (caps_.max_total > 0 && open() >= caps_.max_total) return Verdict::kTotalCap;
  if (caps_.max_per_client > 0 && open_from(client) >= caps_.max_per_client) return Verdict::kClientCap;
  Entry e;
  e.inode = st.st_ino;
  e.device = st.st_dev;
  e.client = client;
  e.peer = peer;
  by_fd_[fd] = std::move(e);
  fd_by_peer_[peer] = fd;
  per_client_[client].insert(fd);
  rate_.take(client, 1, now);
  return Verdict::kAdmitted;
}

bool ConnectionTable::note_call(absl::string_view peer, TimePoint now, std::string* client) {
  if (caps_.max_calls_per_s <= 0) return false;
  auto p = fd_by_peer_.find(peer);
  if (p == fd_by_peer_.end()) return false;
  auto it = by_fd_.find(p->second);
  if (it == by_fd_.end()) return false;
  Entry& e = it->second;
  const int64_t second = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  if (second != e.window) {
    e.window = second;
    e.calls = 0;
  }
  if (++e.calls <= caps_.max_calls_per_s || e.shut) return false;
  e.shut = true;
  // only the socket it was admitted as: a descriptor gRPC closed and reused
  // for another is left alone
  if (still_open(it->first, e)) ::shutdown(it->first, SHUT_RDWR);
  // expired blocks go first, so that the map holds only addresses refused now
  std::erase_if(blocked_until_, [&](const auto& kv) { return kv.second <= now; });
  blocked_until_[e.client] = now + from_seconds(caps_.block_s);
  *client = e.client;
  return true;
}

int ConnectionTable::open_from(absl::string_view client) const {
  auto it = per_client_.find(client);
  return it == per_client_.end() ? 0 : static_cast<int>(it->second.size());
}

}  // namespace wm::server
