#include "server/session_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace wm::server {

namespace {

constexpr auto kDrainOnStop = std::chrono::seconds(2);

std::string now_text() { return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()); }

nlohmann::ordered_json event(absl::string_view name, const ServerSession& s) {
  nlohmann::ordered_json j;
  j["time"] = now_text();
  j["event"] = std::string(name);
  j["session"] = s.id();
  j["client"] = s.client();
  if (!s.setup().user.empty()) j["user"] = s.setup().user;
  return j;
}

// a client's bytes (none today: ids and addresses are the server's) never break the line
std::string text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

struct SessionLog::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> queue;
  size_t max_queued = kMaxQueuedLines;
  int64_t dropped = 0, dropped_unreported = 0;
  bool stop = false;
  std::chrono::steady_clock::time_point stop_deadline;
  int next_fd = -1;  // from reopen(): the writer takes it between lines
  // the writer thread's own
  int fd = -1;
  bool own_fd = false;
  std::string path;
  bool partial = false;  // the last write stopped mid-line
  bool failure_reported = false;
  bool done = false;     // run() has returned (under mu)

  ~State() {
    if (own_fd && fd >= 0) ::close(fd);
    if (next_fd >= 0) ::close(next_fd);
  }

  bool past_deadline() {
    std::lock_guard<std::mutex> lk(mu);
    return stop && std::chrono::steady_clock::now() >= stop_deadline;
  }

  // the line and its newline in one write(2) where the system allows;
  // false if it did not all go out
  bool write_line(const std::string& line) {
    const std::string out = (partial ? "\n" : "") + line + "\n";
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (past_deadline()) break;
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      if (!failure_reported) {
        failure_reported = true;
        std::fprintf(stderr, "wmserve: the session log cannot be written (%s); sessions go on without it\n",
                     n < 0 ? std::strerror(errno) : "nothing written");
      }
      break;
    }
    // a line cut short is ended before the next, so that lines never run together
    partial = done > 0 && done < out.size();
    return done == out.size();
  }

  void run() {
    write_all();
    std::lock_guard<std::mutex> lk(mu);
    done = true;
    cv.notify_all();
  }

  void write_all() {
    for (;;) {
      std::deque<std::string> batch;
      int new_fd = -1;
      int64_t lost = 0;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty() || next_fd >= 0 || dropped_unreported > 0; });
        batch.swap(queue);
        new_fd = std::exchange(next_fd, -1);
        lost = std::exchange(dropped_unreported, 0);
        if (stop && batch.empty() && new_fd < 0 && lost == 0) break;
      }
      if (new_fd >= 0) {
        if (own_fd) ::close(fd);
        fd = new_fd;
        partial = false;
        failure_reported = false;
      }
      if (lost > 0) {
        nlohmann::ordered_json j;
        j["time"] = now_text();
        j["event"] = "dropped";
        j["lines"] = lost;
        batch.push_front(text(j));
      }
      for (const std::string& line : batch) {
        if (past_deadline()) return;
        write_line(line);
      }
    }
  }
};

namespace {

// the log opened for appending without waiting: a FIFO with no reader is
// refused (ENXIO) rather than blocking the caller, which is the main thread
// with SIGTERM held; the fd stays non-blocking (write_line polls)
int open_for_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
}

std::string open_error(int err) {
  if (err == ENXIO) return "a FIFO that nobody reads (start its reader first)";
  return std::strerror(err);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionLog>> SessionLog::open(const std::string& where, size_t max_queued) {
  if (where.empty()) return absl::InvalidArgumentError("--session_log: an empty path");
  auto state = std::make_shared<State>();
  state->max_queued = max_queued;
  if (where == "-") {
    state->fd = STDOUT_FILENO;
  } else {
    state->fd = open_for_append(where);
    if (state->fd < 0)
      return absl::InvalidArgumentError(absl::StrCat("--session_log ", where, ": cannot open for appending: ",
                                                     open_error(errno)));
    struct stat st;
    if (::fstat(state->fd, &st) != 0 || S_ISDIR(st.st_mode)) {
      ::close(state->fd);
      return absl::InvalidArgumentError(absl::StrCat("--session_log ", where, ": not a file"));
    }
    state->own_fd = true;
    state->path = where;
  }
  return std::unique_ptr<SessionLog>(new SessionLog(std::move(state)));
}

SessionLog::SessionLog(std::shared_ptr<State> state) : state_(std::move(state)) {
  writer_ = std::thread([s = state_] { s->run(); });
}

SessionLog::~SessionLog() {
  bool done = false;
  {
    std::unique_lock<std::mutex> lk(state_->mu);
    state_->stop = true;
    state_->stop_deadline = std::chrono::steady_clock::now() + kDrainOnStop;
    state_->cv.notify_all();
    // a writer blocked in write(2) on a pipe nobody reads would hold the
    // server's exit: wait for it until a little past the deadline, then
    // leave it behind (it shares the state, which outlives this object)
    done = state_->cv.wait_for(lk, kDrainOnStop + std::chrono::milliseconds(200), [&] { return state_->done; });
  }
  if (done) {
    writer_.join();
  } else {
    writer_.detach();
  }
}

absl::Status SessionLog::reopen() {
  if (state_->path.empty()) return absl::OkStatus();
  const int fd = open_for_append(state_->path);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("--session_log ", state_->path, ": cannot open for appending: ",
                                               open_error(errno), "; still writing the file it had open"));
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->next_fd >= 0) ::close(state_->next_fd);
    state_->next_fd = fd;
  }
  state_->cv.notify_all();
  return absl::OkStatus();
}

int64_t SessionLog::dropped() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->dropped;
}

void SessionLog::enqueue(std::string line) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (state_->queue.size() >= state_->max_queued) {
      ++state_->dropped;
      ++state_->dropped_unreported;
      return;
    }
    state_->queue.push_back(std::move(line));
  }
  state_->cv.notify_one();
}

void SessionLog::started(const ServerSession& s, int64_t kv_reserved_bytes) {
  const StartParams& p = s.params();
  nlohmann::ordered_json j = event("start", s);
  j["format"] = p.cache_format;
  j["seed"] = p.seed;
  j["prompt_frames"] = p.prompt.size();
  j["pacing"] = p.pacing == PacingMode::kFixedRate ? "fixed_rate" : "per_action";
  if (p.pacing == PacingMode::kFixedRate) j["fps"] = p.fps;
  j["audit"] = p.audit;
  j["batch_invariant"] = p.batch_invariant;
  j["kv_reserved_bytes"] = kv_reserved_bytes;
  enqueue(text(j));
}

void SessionLog::parked(const ServerSession& s) { enqueue(text(event("park", s))); }

void SessionLog::resumed(const ServerSession& s) { enqueue(text(event("resume", s))); }

void SessionLog::ended(const ServerSession& s, EndReason reason, double seconds) {
  nlohmann::ordered_json j = event("end", s);
  j["reason"] = std::string(end_reason_label(reason));
  j["seconds"] = std::round(seconds * 1000) / 1000;
  j["frames_sent"] = s.frames_sent();
  j["frames_dropped"] = s.frames_dropped();
  // an audited session: what its full-precision shadow measured (the
  // metrics of the same names pool every session of the format)
  if (const std::optional<DriftStats> d = s.audit_result(); d.has_value()) {
    j["drift"] = d->drift();
    j["drift_queries"] = d->queries;
    if (d->frames > 0) {
      j["shadow_frame_psnr_db"] = d->frame_psnr();
      j["shadow_frame_psnr_min_db"] = d->frame_psnr_min;
      j["shadow_frames"] = d->frames;
    }
  }
  enqueue(text(j));
}

}  // namespace wm::server
