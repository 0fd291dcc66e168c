// Timing decisions of the engine thread, as pure functions of the clock:
// the steady tick of a fixed-rate session, and which sessions go into the
// next engine step (the bounded wait that fills a batch).
//
// Pure code, unit-tested with tables of times in tests/server/pacing_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "server/clock.h"

namespace wm::server {

// one tick of a fixed-rate session: the block it starts is due at `due` and
// late if its frames are ready after `deadline` (one period later)
struct Tick {
  TimePoint due;
  TimePoint deadline;
  int64_t skipped = 0;  // whole ticks that were skipped because the engine fell behind
};

// a steady rate: ticks at start, start + period, ...; a tick taken late does
// not make the next ones late (no catch-up bursts): ticks that passed
// entirely are skipped and counted as missed
class FixedRatePacer {
 public:
  FixedRatePacer(Duration period, TimePoint start);
  TimePoint due() const { return due_; }
  bool is_due(TimePoint now) const { return now >= due_; }
  // precondition: is_due(now)
  Tick take(TimePoint now);
  Duration period() const { return period_; }

 private:
  Duration period_;
  TimePoint due_;
};

// what the planner knows of one session
struct StepCandidate {
  bool fixed_rate = false;
  bool ready = false;         // has work now (queued actions, or its tick is due)
  TimePoint ready_since;      // ready: oldest queued action's arrival, or the tick's due time
  TimePoint next_due;         // fixed-rate and not ready: when its tick falls due
  TimePoint served_until;     // the end of its last step (TimePoint{} before its first)
};

// where a ready session stands in line: the later of its readiness and the
// end of its last step. A session that keeps actions queued stays ready
// since its oldest one arrived, long ago; counted from its last step it
// queues behind the sessions that became ready while it was served, so that
// sessions with a backlog take turns with the others (and with each other)
// instead of keeping the batch to themselves.
inline TimePoint turn_since(const StepCandidate& c) { return std::max(c.ready_since, c.served_until); }

struct StepPlan {
  bool go = false;                 // step now with `batch`
  std::vector<size_t> batch;       // candidate indices, longest in line first (turn_since), at most max_batch
  TimePoint wake_at = TimePoint::max();  // !go: plan again at this time (or when woken)
};

// Step now when every session that could have work within the wait has it,
// when the batch is full, or when the wait is over; otherwise wait. The wait
// is max_wait from when there was both work and a free engine: from the
// oldest ready session's readiness, or from `engine_free_since` (the end of
// the last step) if that is later, so that sessions whose frames just went
// out get the same short chance to join as the one that waited through the
// last step. A per-action session without work may send at any moment, so it
// is waited for; a fixed-rate session only if its tick falls due before the
// wait ends.
StepPlan plan_step(std::span<const StepCandidate> sessions, TimePoint now, Duration max_wait, int max_batch,
                   TimePoint engine_free_since = TimePoint{});

}  // namespace wm::server
