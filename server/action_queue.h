// A session's input: the bounded queue of actions received and not yet
// applied, and how a block of frames takes them (docs/API.md, "Pacing").
//
//  - per-action pacing: a block takes up to frames_per_block queued actions
//    in order and repeats the last one if fewer are queued; the session is
//    ready while anything is queued. A full queue refuses the new action.
//  - fixed-rate pacing: the queue keeps only the latest frames_per_block
//    actions (older ones are superseded); a tick takes them, padded with the
//    latest, and with nothing new it repeats the last applied action (the
//    null action before the first).
//
// Pure code, unit-tested in tests/server/pacing_test.cc.
// Threading: not thread-safe; the engine worker's mutex guards it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "engine/action.h"
#include "server/clock.h"

namespace wm::server {

enum class PacingMode { kPerAction, kFixedRate };

struct TimedAction {
  Action action;               // action.seq is the client's seq
  int64_t client_time_us = 0;  // the client's clock, echoed in frames
  TimePoint arrival;           // when the server read it
};

// the actions of one block, one per frame
struct Block {
  std::vector<Action> actions;
  std::vector<int64_t> client_time_us;
  std::vector<TimePoint> arrival;
  std::vector<bool> fresh;     // the first frame that applies its action (action-to-frame latency)
  int new_actions = 0;         // queued actions this block consumed
};

class ActionQueue {
 public:
  // capacity: queued actions at most in per-action pacing (fixed-rate keeps
  // frames_per_block); precondition capacity >= frames_per_block >= 1
  ActionQueue(PacingMode pacing, int capacity, int frames_per_block);

  // seq must be above every seq seen before (INVALID_ARGUMENT otherwise);
  // a full per-action queue refuses the action (RESOURCE_EXHAUSTED). In
  // fixed-rate pacing the oldest queued action is superseded instead and
  // counted in *superseded. The action itself must already be valid for the
  // model's action space.
  absl::Status push(const TimedAction& a, int* superseded = nullptr);

  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  int capacity() const { return capacity_; }
  // arrival of the oldest queued action; precondition !empty()
  TimePoint oldest_arrival() const;
  uint64_t last_seq() const { return last_seq_; }

  // the next block; per-action pacing requires !empty()
  Block take_block();

 private:
  PacingMode pacing_;
  int capacity_;
  int frames_per_block_;
  std::deque<TimedAction> queue_;
  TimedAction last_applied_;   // seq 0: the null action
  uint64_t last_seq_ = 0;      // highest seq accepted
};

}  // namespace wm::server
