// Client-side statistics of a played session, as pure functions:
// percentiles, dropped frames (index gaps) and freezes.
#pragma once

#include <cstdint>
#include <vector>

namespace wm::client {

// the q-quantile (0..1) by linear interpolation between order statistics; 0 for no values
double percentile(std::vector<double> values, double q);
double mean(const std::vector<double>& values);

// frames missing from a sequence of received frame indices (gaps between
// consecutive indices; indices are expected to increase by one)
int64_t count_index_gaps(const std::vector<int64_t>& indices);

// freezes among inter-frame intervals: an interval of at least
// max(3 x mean interval, mean + 150 ms) (the WebRTC freeze definition)
struct FreezeStats {
  int64_t count = 0;
  double total_seconds = 0;
  double threshold_seconds = 0;
};
FreezeStats count_freezes(const std::vector<double>& intervals_seconds);

}  // namespace wm::client
