// Which frames a cache keeps: the sink frames 0..S-1 and the W most recent.
// Pure bookkeeping, shared by every format.
#pragma once

#include <cstdint>
#include <vector>

namespace wm {

class FrameWindow {
 public:
  FrameWindow(int window_frames, int sink_frames) : window_(window_frames), sinks_(sink_frames) {}

  // true if frame f stays cached once `generated` frames exist
  bool keeps(int64_t f, int64_t generated) const {
    return f < sinks_ || f >= generated - window_;
  }
  bool is_sink(int64_t f) const { return f < sinks_; }
  // the frames kept once `generated` frames exist, ascending
  std::vector<int64_t> kept(int64_t generated) const {
    std::vector<int64_t> out;
    for (int64_t f = 0; f < generated; ++f)
      if (keeps(f, generated)) out.push_back(f);
    return out;
  }
  int window() const { return window_; }
  int sinks() const { return sinks_; }

 private:
  int window_;
  int sinks_;
};

}  // namespace wm
