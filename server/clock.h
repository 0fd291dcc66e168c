// The server's one clock: monotonic, so pacing and latencies never jump.
#pragma once

#include <chrono>
#include <cstdint>

namespace wm::server {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Duration = Clock::duration;

inline int64_t to_us(Duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }
inline double to_seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration from_seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace wm::server
