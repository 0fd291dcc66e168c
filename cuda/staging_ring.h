// Where host-to-device uploads are staged: a ring over one pinned host
// buffer. A copy from pageable memory may make the driver wait for the stream
// (it stages through its own pinned buffer), so every upload of the step path
// (modulation, positions, the attention plan, the write pass's tables) is
// first copied here by the host and then DMA'd asynchronously. A region stays
// busy until the device has read it (a fence recorded after its copy); a new
// region never overlaps a busy one: placing it first waits for the oldest
// regions in the way, oldest first.
//
// Pure bookkeeping (offsets and fence numbers), unit-tested without a GPU
// (tests/engine/cuda_host_test.cc); cuda_backend.cc owns the memory and maps
// fences to CUDA events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace wm::cuda {

class StagingRing {
 public:
  // max_in_flight: regions busy at once (the backend's events); >= 1
  StagingRing(size_t capacity, size_t max_in_flight);

  size_t capacity() const { return capacity_; }
  size_t in_flight() const { return busy_.size(); }

  // places n bytes (0 < n <= capacity): calls wait(fence) for every busy
  // region that must be finished first, oldest first, and forgets it; returns
  // the offset and the fence the caller records once its copy is queued
  struct Placement {
    size_t offset = 0;
    uint64_t fence = 0;
  };
  template <class Wait>
  Placement place(size_t n, Wait&& wait) {
    for (;;) {
      const size_t at = fits(n);
      if (at != kNone && busy_.size() < max_in_flight_) {
        busy_.push_back({at, n, next_fence_});
        head_ = at + n;
        return {at, next_fence_++};
      }
      wait(busy_.front().fence);
      busy_.pop_front();
      if (busy_.empty()) head_ = 0;
    }
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  struct Region {
    size_t offset, bytes;
    uint64_t fence;
  };
  // where n bytes fit at or after head (or at 0, wrapping) without touching a busy region
  size_t fits(size_t n) const;

  size_t capacity_, max_in_flight_;
  size_t head_ = 0;  // end of the newest region
  uint64_t next_fence_ = 0;
  std::deque<Region> busy_;  // oldest first, in ring order
};

}  // namespace wm::cuda
