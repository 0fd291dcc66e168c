// Pacing and input bookkeeping as pure code: the action queue (per-action
// and fixed-rate), the fixed-rate tick and the batch planner's bounded wait,
// step by step against tables of times.
#include <gtest/gtest.h>

#include "server/action_queue.h"
#include "server/pacing.h"

namespace wm::server {
namespace {

using std::chrono::milliseconds;

TimedAction act(uint64_t seq, uint32_t keys, int arrival_ms) {
  TimedAction a;
  a.action.seq = seq;
  a.action.keys = keys;
  a.client_time_us = static_cast<int64_t>(seq) * 1000;
  a.arrival = TimePoint{} + milliseconds(arrival_ms);
  return a;
}

std::vector<uint64_t> seqs(const Block& b) {
  std::vector<uint64_t> out;
  for (const auto& a : b.actions) out.push_back(a.seq);
  return out;
}

TEST(ActionQueue, PerActionBlocksTakeQueuedActionsAndRepeatTheLast) {
  ActionQueue q(PacingMode::kPerAction, 4, 3);
  ASSERT_TRUE(q.push(act(1, 1, 0)).ok());
  ASSERT_TRUE(q.push(act(2, 2, 1)).ok());
  EXPECT_EQ(q.oldest_arrival(), TimePoint{});
  Block b = q.take_block();
  EXPECT_EQ(seqs(b), (std::vector<uint64_t>{1, 2, 2}));
  EXPECT_EQ(b.fresh, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(b.new_actions, 2);
  EXPECT_EQ(b.client_time_us, (std::vector<int64_t>{1000, 2000, 2000}));
  EXPECT_TRUE(q.empty());
  for (uint64_t s = 3; s <= 6; ++s) ASSERT_TRUE(q.push(act(s, 0, 2)).ok());
  // the fifth queued action does not fit: refused, the queue unchanged
  auto full = q.push(act(7, 0, 3));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(q.size(), 4u);
  EXPECT_EQ(seqs(q.take_block()), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(seqs(q.take_block()), (std::vector<uint64_t>{6, 6, 6}));
  // a refused action does not count as seen: the client may send it again
  EXPECT_EQ(q.last_seq(), 6u);
  EXPECT_TRUE(q.push(act(7, 0, 4)).ok());
}

TEST(ActionQueue, SeqMustIncreaseFromOne) {
  ActionQueue q(PacingMode::kPerAction, 8, 1);
  EXPECT_EQ(q.push(act(0, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(q.push(act(5, 0, 0)).ok());
  EXPECT_EQ(q.push(act(5, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.push(act(4, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(q.push(act(9, 0, 0)).ok());  // gaps are fine
  EXPECT_EQ(q.size(), 2u);
}

TEST(ActionQueue, FixedRateKeepsTheLatestAndRepeatsTheLastApplied) {
  ActionQueue q(PacingMode::kFixedRate, 32, 2);
  EXPECT_EQ(q.capacity(), 2);
  // nothing ever sent: the null action (seq 0)
  Block b0 = q.take_block();
  EXPECT_EQ(seqs(b0), (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(b0.fresh, (std::vector<bool>{false, false}));
  int superseded = 0;
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(q.push(act(s, static_cast<uint32_t>(s), 0), &superseded).ok());
  EXPECT_EQ(superseded, 3);  // 1, 2, 3 replaced by newer ones
  EXPECT_EQ(seqs(q.take_block()), (std::vector<uint64_t>{4, 5}));
  Block idle = q.take_block();  // no new action: the last one again
  EXPECT_EQ(seqs(idle), (std::vector<uint64_t>{5, 5}));
  EXPECT_EQ(idle.new_actions, 0);
  EXPECT_EQ(idle.actions[0].keys, 5u);
}

TEST(FixedRatePacer, TicksAreSteadyAndLateTicksSkipInsteadOfBursting) {
  const TimePoint t0{};
  FixedRatePacer p(milliseconds(100), t0);
  struct Step {
    int now_ms;          // when the engine takes the tick
    int due_ms;          // the tick it gets
    int64_t skipped;
    int next_due_ms;
  };
  const Step steps[] = {
      {0, 0, 0, 100},
      {100, 100, 0, 200},
      {230, 200, 0, 300},   // 30 ms late: still tick 200, the next stays at 300
      {300, 300, 0, 400},
      {650, 600, 2, 700},   // 400 and 500 passed entirely: skipped, no burst
      {700, 700, 0, 800},
  };
  for (const Step& s : steps) {
    SCOPED_TRACE(testing::Message() << "now " << s.now_ms << " ms");
    const TimePoint now = t0 + milliseconds(s.now_ms);
    ASSERT_TRUE(p.is_due(now));
    const Tick t = p.take(now);
    EXPECT_EQ(t.due, t0 + milliseconds(s.due_ms));
    EXPECT_EQ(t.deadline, t0 + milliseconds(s.due_ms + 100));
    EXPECT_EQ(t.skipped, s.skipped);
    EXPECT_EQ(p.due(), t0 + milliseconds(s.next_due_ms));
    EXPECT_FALSE(p.is_due(t0 + milliseconds(s.next_due_ms - 1)));
  }
}

StepCandidate per_action(bool ready, int since_ms = 0) {
  StepCandidate c;
  c.ready = ready;
  c.ready_since = TimePoint{} + milliseconds(since_ms);
  return c;
}
StepCandidate fixed(int due_ms, int now_ms) {
  StepCandidate c;
  c.fixed_rate = true;
  c.ready = now_ms >= due_ms;
  c.ready_since = c.next_due = TimePoint{} + milliseconds(due_ms);
  return c;
}

TEST(PlanStep, BoundedWaitFillsTheBatch) {
  const Duration wait = milliseconds(2);
  const TimePoint t0{};
  struct Case {
    const char* what;
    std::vector<StepCandidate> sessions;
    int now_ms;
    int max_batch;
    bool go;
    std::vector<size_t> batch;
    int wake_ms;  // when !go; -1 = never
  };
  const Case cases[] = {
      {"nothing to do", {per_action(false), per_action(false)}, 10, 8, false, {}, -1},
      {"everyone has work: go at once", {per_action(true, 10), per_action(true, 9)}, 10, 8, true, {1, 0}, 0},
      {"one waits for the other, up to 2 ms", {per_action(true, 10), per_action(false)}, 10, 8, false, {}, 12},
      {"the wait is over", {per_action(true, 10), per_action(false)}, 12, 8, true, {0}, 0},
      {"a full batch goes at once", {per_action(true, 10), per_action(true, 10), per_action(false)}, 10, 2, true,
       {0, 1}, 0},
      {"the oldest first when the batch overflows", {per_action(true, 11), per_action(true, 9), per_action(true, 10)},
       11, 2, true, {1, 2}, 0},
      {"a fixed-rate session due later is not waited for", {per_action(true, 10), fixed(50, 10)}, 10, 8, true, {0},
       0},
      {"a fixed-rate session due within the wait is", {per_action(true, 10), fixed(11, 10)}, 10, 8, false, {}, 11},
      {"both then go together", {per_action(true, 10), fixed(11, 11)}, 11, 8, true, {0, 1}, 0},
      {"idle fixed-rate sessions wake the engine at their tick", {fixed(40, 10), fixed(30, 10)}, 10, 8, false, {},
       30},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const StepPlan plan = plan_step(c.sessions, t0 + milliseconds(c.now_ms), wait, c.max_batch, TimePoint{});
    EXPECT_EQ(plan.go, c.go);
    if (c.go) {
      EXPECT_EQ(plan.batch, c.batch);
    } else if (c.wake_ms < 0) {
      EXPECT_EQ(plan.wake_at, TimePoint::max());
    } else {
      EXPECT_EQ(plan.wake_at, t0 + milliseconds(c.wake_ms));
    }
  }
}

TEST(PlanStep, TheWaitStartsWhenTheEngineIsFree) {
  const Duration wait = milliseconds(2);
  const TimePoint t0{};
  // session 0 became ready at 5 ms, during a step that ended at 100 ms; the
  // others got their frames at 100 ms and may answer within the wait
  const std::vector<StepCandidate> s = {per_action(true, 5), per_action(false), per_action(false)};
  StepPlan p = plan_step(s, t0 + milliseconds(100), wait, 8, t0 + milliseconds(100));
  EXPECT_FALSE(p.go);
  EXPECT_EQ(p.wake_at, t0 + milliseconds(102));
  p = plan_step(s, t0 + milliseconds(102), wait, 8, t0 + milliseconds(100));
  EXPECT_TRUE(p.go);
  EXPECT_EQ(p.batch, (std::vector<size_t>{0}));
  // measured from readiness alone it would not have waited at all
  EXPECT_TRUE(plan_step(s, t0 + milliseconds(100), wait, 8).go);
  // everyone answered: go at once
  const std::vector<StepCandidate> all = {per_action(true, 5), per_action(true, 101), per_action(true, 101)};
  p = plan_step(all, t0 + milliseconds(101), wait, 8, t0 + milliseconds(100));
  EXPECT_TRUE(p.go);
  EXPECT_EQ(p.batch, (std::vector<size_t>{0, 1, 2}));
}

TEST(PlanStep, SessionsWithABacklogTakeTurnsWithTheOthers) {
  // 8 per-action sessions, batches of 4, steps of 10 ms. Sessions 0-3 keep
  // actions queued (ready since their first action, at 0 ms); sessions 4-7
  // send their next action 1 ms after the step that served them ends (one
  // action in flight). Counted from readiness alone, 0-3 would be the
  // oldest at every step and 4-7 would never be served.
  const Duration wait = milliseconds(2);
  const TimePoint t0{};
  std::vector<StepCandidate> s(8);
  for (size_t i = 0; i < s.size(); ++i) {
    s[i].ready = true;
    s[i].ready_since = t0 + milliseconds(i < 4 ? 0 : 1);
  }
  std::vector<int> served(s.size(), 0);
  TimePoint now = t0 + milliseconds(1);
  for (int step = 0; step < 40; ++step) {
    // sessions 4-7 answer their last frames within the step after it
    for (size_t i = 4; i < s.size(); ++i)
      if (!s[i].ready && s[i].served_until + milliseconds(1) <= now) {
        s[i].ready = true;
        s[i].ready_since = s[i].served_until + milliseconds(1);
      }
    const StepPlan plan = plan_step(s, now, wait, 4, now);
    ASSERT_TRUE(plan.go) << "step " << step;
    ASSERT_EQ(plan.batch.size(), 4u);
    now += milliseconds(10);
    for (size_t i : plan.batch) {
      ++served[i];
      s[i].served_until = now;
      if (i >= 4) s[i].ready = false;  // its one action was taken
    }
  }
  // 40 steps x 4 places: every session gets its 20, give or take one
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_GE(served[i], 19) << "session " << i;
    EXPECT_LE(served[i], 21) << "session " << i;
  }
}

TEST(PlanStep, ASessionJustServedQueuesBehindOnesThatWaitedThroughItsStep) {
  // session 0 has had actions queued since 0 ms and was served by the step
  // that ended at 100 ms; session 1's action came at 60 ms, during that step
  std::vector<StepCandidate> s = {per_action(true, 0), per_action(true, 60)};
  s[0].served_until = TimePoint{} + milliseconds(100);
  const TimePoint now = TimePoint{} + milliseconds(100);
  StepPlan p = plan_step(s, now, milliseconds(2), 1, now);
  ASSERT_TRUE(p.go);
  EXPECT_EQ(p.batch, (std::vector<size_t>{1}));
  // before session 0's first step, its older action goes first
  s[0].served_until = TimePoint{};
  p = plan_step(s, now, milliseconds(2), 1, now);
  ASSERT_TRUE(p.go);
  EXPECT_EQ(p.batch, (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace wm::server
