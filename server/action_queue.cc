#include "server/action_queue.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace wm::server {

ActionQueue::ActionQueue(PacingMode pacing, int capacity, int frames_per_block)
    : pacing_(pacing), capacity_(capacity), frames_per_block_(frames_per_block) {
  WM_CHECK(frames_per_block >= 1 && capacity >= frames_per_block);
  if (pacing_ == PacingMode::kFixedRate) capacity_ = frames_per_block;
}

absl::Status ActionQueue::push(const TimedAction& a, int* superseded) {
  if (a.action.seq == 0 || a.action.seq <= last_seq_)
    return absl::InvalidArgumentError(absl::StrCat("action seq ", a.action.seq, " must be at least 1 and above ",
                                                   "the last seq received (", last_seq_, ")"));
  if (static_cast<int>(queue_.size()) >= capacity_) {
    if (pacing_ == PacingMode::kPerAction)
      return absl::ResourceExhaustedError(absl::StrCat("action queue full (", capacity_,
                                                       " actions wait for frames); action ", a.action.seq,
                                                       " dropped: send at most as fast as frames arrive"));
    queue_.pop_front();
    if (superseded != nullptr) ++*superseded;
  }
  last_seq_ = a.action.seq;
  queue_.push_back(a);
  return absl::OkStatus();
}

TimePoint ActionQueue::oldest_arrival() const {
  WM_CHECK(!queue_.empty());
  return queue_.front().arrival;
}

Block ActionQueue::take_block() {
  WM_CHECK(pacing_ == PacingMode::kFixedRate || !queue_.empty());
  Block b;
  const auto B = static_cast<size_t>(frames_per_block_);
  b.actions.reserve(B);
  while (b.actions.size() < B) {
    bool fresh = false;
    if (!queue_.empty()) {
      last_applied_ = queue_.front();
      queue_.pop_front();
      fresh = true;
      ++b.new_actions;
    }
    b.actions.push_back(last_applied_.action);
    b.client_time_us.push_back(last_applied_.client_time_us);
    b.arrival.push_back(last_applied_.arrival);
    b.fresh.push_back(fresh);
  }
  return b;
}

}  // namespace wm::server
