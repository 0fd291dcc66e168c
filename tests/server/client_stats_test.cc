// The client's statistics: percentiles, index gaps, freezes.
#include "clients/stats.h"

#include <gtest/gtest.h>

namespace wm::client {
namespace {

TEST(ClientStats, Percentiles) {
  EXPECT_EQ(percentile({}, 0.5), 0);
  EXPECT_EQ(percentile({3}, 0.99), 3);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 1.0), 5);
  std::vector<double> v;
  for (int i = 1; i <= 101; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(v, 0.99), 100);
  EXPECT_DOUBLE_EQ(mean({1, 2, 3}), 2);
}

TEST(ClientStats, IndexGapsAreDroppedFrames) {
  EXPECT_EQ(count_index_gaps({}), 0);
  EXPECT_EQ(count_index_gaps({0, 1, 2, 3}), 0);
  EXPECT_EQ(count_index_gaps({0, 2, 3, 7}), 4);
}

TEST(ClientStats, FreezesUseTheWebRtcThreshold) {
  // mean 0.1 s: threshold max(0.3, 0.25) = 0.3
  std::vector<double> iv(9, 0.05);
  iv.push_back(0.55);
  const FreezeStats f = count_freezes(iv);
  EXPECT_NEAR(f.threshold_seconds, 0.3, 1e-9);
  EXPECT_EQ(f.count, 1);
  EXPECT_NEAR(f.total_seconds, 0.55, 1e-9);
  // fast frames: mean + 150 ms dominates, and a steady stream has no freeze
  const FreezeStats steady = count_freezes(std::vector<double>(100, 0.01));
  EXPECT_NEAR(steady.threshold_seconds, 0.16, 1e-9);
  EXPECT_EQ(steady.count, 0);
}

}  // namespace
}  // namespace wm::client
