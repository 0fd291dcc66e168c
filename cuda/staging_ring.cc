#include "cuda/staging_ring.h"

#include <algorithm>

namespace wm::cuda {

StagingRing::StagingRing(size_t capacity, size_t max_in_flight)
    : capacity_(capacity), max_in_flight_(std::max<size_t>(1, max_in_flight)) {}

size_t StagingRing::fits(size_t n) const {
  if (n == 0 || n > capacity_) return kNone;
  if (busy_.empty()) return 0;
  const size_t tail = busy_.front().offset;
  if (head_ > tail) {
    // busy: [tail, head); free: [head, capacity) and [0, tail)
    if (head_ + n <= capacity_) return head_;
    if (n <= tail) return 0;
    return kNone;
  }
  // wrapped (or exactly full): busy from tail to the end and from 0 to head; free: [head, tail)
  return head_ + n <= tail ? head_ : kNone;
}

}  // namespace wm::cuda
