#include "server/grpc_log.h"

#include <cstdio>
#include <cstring>
#include <mutex>

#include <grpc/support/log.h>

namespace wm::server {

bool LogLimiter::admit(TimePoint now, int64_t* dropped) {
  *dropped = 0;
  if (in_window_ == 0 || now - window_start_ >= std::chrono::seconds(1) || now < window_start_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++dropped_;
    return false;
  }
  ++in_window_;
  *dropped = dropped_;
  dropped_ = 0;
  return true;
}

namespace {

std::mutex g_mu;
LogLimiter* g_limiter = nullptr;  // set once, never freed: gRPC may log until exit
int g_per_second = 0;

void log_line(gpr_log_func_args* args) {
  std::lock_guard<std::mutex> lk(g_mu);
  int64_t dropped = 0;
  if (!g_limiter->admit(Clock::now(), &dropped)) return;
  if (dropped > 0)
    std::fprintf(stderr, "wmserve: grpc: %lld log lines dropped (at most %d a second)\n",
                 static_cast<long long>(dropped), g_per_second);
  const char* file = args->file != nullptr ? args->file : "?";
  if (const char* slash = std::strrchr(file, '/'); slash != nullptr) file = slash + 1;
  std::fprintf(stderr, "wmserve: grpc %s %s:%d] %s\n", gpr_log_severity_string(args->severity), file, args->line,
               args->message != nullptr ? args->message : "");
}

}  // namespace

void limit_grpc_log(int per_second) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_limiter == nullptr) g_limiter = new LogLimiter(per_second);
    else *g_limiter = LogLimiter(per_second);
    g_per_second = per_second;
  }
  gpr_set_log_function(log_line);
}

}  // namespace wm::server
