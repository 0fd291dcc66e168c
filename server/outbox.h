// A stream's outgoing queue between the engine (which never waits) and one
// write in flight on the network. Frames are bounded by `frame_capacity`
// (one block's worth): a newer frame pushes out the oldest unsent one, which
// is counted as dropped (reason slow_client). Events are bounded too (the
// oldest droppable one goes); essential messages (Started) are never
// dropped and are never more than a handful.
//
// Pure code, unit-tested in tests/server/outbox_test.cc.
// Threading: not thread-safe; the session's output mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "common/status_macros.h"

namespace wm::server {

enum class OutKind { kEssential, kEvent, kFrame };

template <typename Item>
class Outbox {
 public:
  Outbox(size_t frame_capacity, size_t event_capacity) : frame_capacity_(frame_capacity), event_capacity_(event_capacity) {
    WM_CHECK(frame_capacity >= 1 && event_capacity >= 1);
  }

  // returns how many unsent frames this push dropped (0 or more)
  int push_frame(Item item) {
    items_.emplace_back(OutKind::kFrame, std::move(item));
    ++frames_;
    int dropped = 0;
    while (frames_ > frame_capacity_) {
      erase_oldest(OutKind::kFrame);
      ++dropped;
    }
    frames_dropped_ += static_cast<uint64_t>(dropped);
    return dropped;
  }
  // returns false when an older event had to be dropped to make room
  bool push_event(Item item) {
    items_.emplace_back(OutKind::kEvent, std::move(item));
    ++events_;
    if (events_ > event_capacity_) {
      erase_oldest(OutKind::kEvent);
      ++events_dropped_;
      return false;
    }
    return true;
  }
  void push_essential(Item item) { items_.emplace_back(OutKind::kEssential, std::move(item)); }
  // an essential message ahead of everything queued (Started: the first
  // message of a stream, whatever was queued before it existed)
  void push_essential_first(Item item) { items_.emplace_front(OutKind::kEssential, std::move(item)); }

  // the oldest item, in push order
  std::optional<std::pair<OutKind, Item>> pop() {
    if (items_.empty()) return std::nullopt;
    auto front = std::move(items_.front());
    items_.pop_front();
    if (front.first == OutKind::kFrame) --frames_;
    if (front.first == OutKind::kEvent) --events_;
    return front;
  }
  // drops everything unsent (frames count as dropped); returns the frames dropped
  int clear() {
    const int dropped = static_cast<int>(frames_);
    frames_dropped_ += frames_;
    items_.clear();
    frames_ = events_ = 0;
    return dropped;
  }

  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  size_t frames() const { return frames_; }
  size_t events() const { return events_; }
  uint64_t frames_dropped() const { return frames_dropped_; }
  uint64_t events_dropped() const { return events_dropped_; }

 private:
  void erase_oldest(OutKind kind) {
    for (auto it = items_.begin(); it != items_.end(); ++it) {
      if (it->first == kind) {
        items_.erase(it);
        if (kind == OutKind::kFrame) --frames_;
        if (kind == OutKind::kEvent) --events_;
        return;
      }
    }
    WM_CHECK(false);
  }

  size_t frame_capacity_;
  size_t event_capacity_;
  std::deque<std::pair<OutKind, Item>> items_;
  size_t frames_ = 0;
  size_t events_ = 0;
  uint64_t frames_dropped_ = 0;
  uint64_t events_dropped_ = 0;
};

}  // namespace wm::server
