#include "server/session_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace wm::server {

namespace {

nlohmann::ordered_json event(absl::string_view name, const ServerSession& s) {
  nlohmann::ordered_json j;
  j["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  j["event"] = std::string(name);
  j["session"] = s.id();
  j["client"] = s.client();
  if (!s.setup().user.empty()) j["user"] = s.setup().user;
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionLog>> SessionLog::open(const std::string& where) {
  if (where.empty()) return absl::InvalidArgumentError("--session_log: an empty path");
  if (where == "-") return std::unique_ptr<SessionLog>(new SessionLog(stdout, false, ""));
  std::FILE* f = std::fopen(where.c_str(), "ae");
  if (f == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("--session_log ", where, ": cannot open for appending: ",
                                                   std::strerror(errno)));
  return std::unique_ptr<SessionLog>(new SessionLog(f, true, where));
}

absl::Status SessionLog::reopen() {
  if (!own_) return absl::OkStatus();
  std::FILE* f = std::fopen(path_.c_str(), "ae");
  if (f == nullptr)
    return absl::UnavailableError(absl::StrCat("--session_log ", path_, ": cannot open for appending: ",
                                               std::strerror(errno), "; still writing the file it had open"));
  std::lock_guard<std::mutex> lk(mu_);
  std::fclose(out_);
  out_ = f;
  failed_ = false;
  return absl::OkStatus();
}

SessionLog::~SessionLog() {
  if (own_) std::fclose(out_);
}

void SessionLog::write(const std::string& line) {
  std::lock_guard<std::mutex> lk(mu_);
  const bool ok = std::fwrite(line.data(), 1, line.size(), out_) == line.size() && std::fputc('\n', out_) != EOF &&
                  std::fflush(out_) == 0;
  if (!ok && !failed_) {
    failed_ = true;
    std::fprintf(stderr, "wmserve: the session log cannot be written (%s); sessions go on without it\n",
                 std::strerror(errno));
  }
  if (!ok) std::clearerr(out_);
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
  // a client's bytes (none today: ids and addresses are the server's) never break the line
  write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void SessionLog::parked(const ServerSession& s) {
  write(event("park", s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void SessionLog::resumed(const ServerSession& s, const std::string& client) {
  nlohmann::ordered_json j = event("resume", s);
  j["client"] = client;
  write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void SessionLog::ended(const ServerSession& s, EndReason reason, double seconds) {
  nlohmann::ordered_json j = event("end", s);
  j["reason"] = std::string(end_reason_label(reason));
  j["seconds"] = std::round(seconds * 1000) / 1000;
  j["frames_sent"] = s.frames_sent();
  j["frames_dropped"] = s.frames_dropped();
  write(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace wm::server
