#include "server/connection_table.h"

#include <sys/stat.h>

namespace wm::server {

bool ConnectionTable::still_open(int fd, const Entry& e) const {
  struct stat st;
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == e.inode && st.st_dev == e.device;
}

void ConnectionTable::forget(std::map<int, Entry>::iterator it) {
  auto pc = per_client_.find(it->second.client);
  if (pc != per_client_.end() && --pc->second <= 0) per_client_.erase(pc);
  by_fd_.erase(it);
}

void ConnectionTable::sweep() {
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    auto next = std::next(it);
    if (!still_open(it->first, it->second)) forget(it);
    it = next;
  }
}

bool ConnectionTable::full(const std::string& client) const {
  if (caps_.max_total > 0 && open() >= caps_.max_total) return true;
  return caps_.max_per_client > 0 && open_from(client) >= caps_.max_per_client;
}

ConnectionTable::Verdict ConnectionTable::admit(int fd, const std::string& client, TimePoint now) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return Verdict::kNotASocket;
  // the descriptor is ours again: whatever it held before is closed
  if (auto it = by_fd_.find(fd); it != by_fd_.end()) forget(it);
  if (rate_.limited() && rate_.left(client, now) < 1) return Verdict::kClientRate;
  if (full(client)) sweep();
  if (caps_.max_total > 0 && open() >= caps_.max_total) return Verdict::kTotalCap;
  if (caps_.max_per_client > 0 && open_from(client) >= caps_.max_per_client) return Verdict::kClientCap;
  by_fd_[fd] = Entry{st.st_ino, st.st_dev, client};
  ++per_client_[client];
  rate_.take(client, 1, now);
  return Verdict::kAdmitted;
}

int ConnectionTable::open_from(absl::string_view client) const {
  auto it = per_client_.find(client);
  return it == per_client_.end() ? 0 : it->second;
}

}  // namespace wm::server
