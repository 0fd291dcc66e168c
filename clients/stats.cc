#include "clients/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace wm::client {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

int64_t count_index_gaps(const std::vector<int64_t>& indices) {
  int64_t gaps = 0;
  for (size_t i = 1; i < indices.size(); ++i)
    if (indices[i] > indices[i - 1] + 1) gaps += indices[i] - indices[i - 1] - 1;
  return gaps;
}

FreezeStats count_freezes(const std::vector<double>& intervals_seconds) {
  FreezeStats f;
  if (intervals_seconds.empty()) return f;
  const double m = mean(intervals_seconds);
  f.threshold_seconds = std::max(3.0 * m, m + 0.150);
  for (double d : intervals_seconds) {
    if (d >= f.threshold_seconds) {
      ++f.count;
      f.total_seconds += d;
    }
  }
  return f;
}

}  // namespace wm::client
