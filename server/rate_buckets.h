// Token buckets per client: `burst` at once, refilled at `rate` a second.
// The Start ration (SessionManager: prompt frames) and the connection rate
// (ConnectionTable: accepted connections) are each one of these. A full
// bucket is the same as none, so only clients still refilling are stored;
// the map is swept of full ones whenever it has doubled since the last
// sweep, so taking is amortized O(log n) and the map holds about the
// clients of the last burst / rate seconds.
//
// Pure code; not thread-safe (its owner's lock or thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "server/clock.h"

namespace wm::server {

class RateBuckets {
 public:
  // rate <= 0: no limit (left() is always the burst, take() stores nothing)
  RateBuckets(double rate, double burst) : rate_(rate), burst_(burst) {}

  bool limited() const { return rate_ > 0; }
  double rate() const { return rate_; }
  double burst() const { return burst_; }
  // what `client` may take at `now`
  double left(absl::string_view client, TimePoint now) const {
    auto it = buckets_.find(client);
    if (!limited() || it == buckets_.end()) return burst_;
    return refilled(it->second, now);
  }
  // takes `amount` from the client's bucket (the caller checked left() first)
  void take(absl::string_view client, double amount, TimePoint now) {
    if (!limited() || amount <= 0) return;
    const double after = left(client, now) - amount;
    if (buckets_.size() >= prune_at_) {
      std::erase_if(buckets_, [&](const auto& kv) { return refilled(kv.second, now) >= burst_; });
      prune_at_ = std::max<size_t>(kMinPruneAt, 2 * buckets_.size());
    }
    auto it = buckets_.find(client);
    if (it == buckets_.end()) it = buckets_.emplace(std::string(client), Bucket{}).first;
    it->second = Bucket{after, now};
  }
  // clients whose bucket is not full (the others are not stored)
  size_t stored() const { return buckets_.size(); }

 private:
  struct Bucket {
    double left = 0;
    TimePoint at;
  };
  double refilled(const Bucket& b, TimePoint now) const {
    // a clock that went back refills nothing
    const double elapsed = std::max(0.0, to_seconds(now - b.at));
    return std::min(burst_, b.left + elapsed * rate_);
  }

  static constexpr size_t kMinPruneAt = 64;
  double rate_ = 0, burst_ = 0;
  std::map<std::string, Bucket, std::less<>> buckets_;
  size_t prune_at_ = kMinPruneAt;  // the map's size that sweeps it
};

}  // namespace wm::server
