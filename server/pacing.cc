#include "server/pacing.h"

#include <algorithm>

#include "common/status_macros.h"

namespace wm::server {

FixedRatePacer::FixedRatePacer(Duration period, TimePoint start) : period_(period), due_(start) {
  WM_CHECK(period > Duration::zero());
}

Tick FixedRatePacer::take(TimePoint now) {
  WM_CHECK(now >= due_);
  Tick t;
  // ticks whose whole period passed before this one was taken are skipped
  const int64_t behind = (now - due_) / period_;
  t.skipped = behind;
  t.due = due_ + behind * period_;
  t.deadline = t.due + period_;
  due_ = t.due + period_;
  return t;
}

StepPlan plan_step(std::span<const StepCandidate> sessions, TimePoint now, Duration max_wait, int max_batch,
                   TimePoint engine_free_since) {
  WM_CHECK(max_batch >= 1);
  StepPlan plan;
  std::vector<size_t> ready;
  TimePoint first_ready = TimePoint::max();
  TimePoint next_due = TimePoint::max();
  for (size_t i = 0; i < sessions.size(); ++i) {
    const StepCandidate& s = sessions[i];
    if (s.ready) {
      ready.push_back(i);
      first_ready = std::min(first_ready, s.ready_since);
    } else if (s.fixed_rate) {
      next_due = std::min(next_due, s.next_due);
    }
  }
  if (ready.empty()) {
    plan.wake_at = next_due;
    return plan;
  }
  const TimePoint wait_end = std::max(first_ready, engine_free_since) + max_wait;
  // sessions that may still bring work before the wait ends
  int expected = 0;
  TimePoint next_expected_due = TimePoint::max();
  for (const StepCandidate& s : sessions) {
    if (s.ready) continue;
    if (!s.fixed_rate) {
      ++expected;
    } else if (s.next_due <= wait_end) {
      ++expected;
      next_expected_due = std::min(next_expected_due, s.next_due);
    }
  }
  if (expected == 0 || static_cast<int>(ready.size()) >= max_batch || now >= wait_end) {
    std::stable_sort(ready.begin(), ready.end(),
                     [&](size_t a, size_t b) { return turn_since(sessions[a]) < turn_since(sessions[b]); });
    if (static_cast<int>(ready.size()) > max_batch) ready.resize(static_cast<size_t>(max_batch));
    plan.go = true;
    plan.batch = std::move(ready);
    return plan;
  }
  plan.wake_at = std::min(wait_end, next_expected_due);
  return plan;
}

}  // namespace wm::server
