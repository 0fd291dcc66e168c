#include "quant/kmeans.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <set>

#include "quant/kmeans_ops.h"

#include "tests/quant/test_util.h"

namespace wm {
namespace {

std::vector<float> clusters(int n, int d, int k, std::mt19937& rng, std::vector<int>* truth) {
  std::vector<float> centres = testing_util::randn(static_cast<size_t>(k) * d, rng, 10.0f);
  std::vector<float> x(static_cast<size_t>(n) * d);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  truth->resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int c = i % k;
    (*truth)[static_cast<size_t>(i)] = c;
    for (int j = 0; j < d; ++j) x[static_cast<size_t>(i) * d + j] = centres[static_cast<size_t>(c) * d + j] + noise(rng);
  }
  return x;
}

TEST(Kmeans, RecoversSeparatedClusters) {
  std::mt19937 rng(1);
  std::vector<int> truth;
  const int n = 400, d = 16, k = 8;
  auto x = clusters(n, d, k, rng, &truth);
  std::vector<float> cen;
  std::vector<int> assign;
  kmeans(x.data(), n, d, d, nullptr, k, 10, 42, &cen, &assign);
  // same partition as the truth (up to relabelling)
  std::vector<int> map(k, -1);
  for (int i = 0; i < n; ++i) {
    int& m = map[static_cast<size_t>(truth[static_cast<size_t>(i)])];
    if (m < 0) m = assign[static_cast<size_t>(i)];
    EXPECT_EQ(m, assign[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(std::set<int>(map.begin(), map.end()).size(), static_cast<size_t>(k));
}

TEST(Kmeans, DeterministicPerSeed) {
  std::mt19937 rng(2);
  auto x = testing_util::randn(300 * 8, rng);
  std::vector<float> c1, c2, c3;
  std::vector<int> a1, a2, a3;
  kmeans(x.data(), 300, 8, 8, nullptr, 16, 4, 7, &c1, &a1);
  kmeans(x.data(), 300, 8, 8, nullptr, 16, 4, 7, &c2, &a2);
  kmeans(x.data(), 300, 8, 8, nullptr, 16, 4, 8, &c3, &a3);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(a1, a2);
  EXPECT_NE(c1, c3);
}

TEST(Kmeans, CentroidsAreTheSameWithoutTheAssignments) {
  std::mt19937 rng(3);
  auto x = testing_util::randn(500 * 16, rng);
  for (int iters : {0, 1, 4}) {
    std::vector<float> c1, c2;
    std::vector<int> a1;
    kmeans(x.data(), 500, 16, 16, nullptr, 12, iters, 5, &c1, &a1);
    kmeans(x.data(), 500, 16, 16, nullptr, 12, iters, 5, &c2, nullptr);
    EXPECT_EQ(c1, c2) << iters << " iterations";
    ASSERT_EQ(a1.size(), 500u);
    // the assignments are the final centroids' nearest
    for (int i = 0; i < 500; i += 37) {
      int idx = -1;
      float dist = 0;
      nearest_centroids(x.data() + i * 16, 16, nullptr, c1.data(), 12, 1, &idx, &dist);
      EXPECT_EQ(a1[static_cast<size_t>(i)], idx) << "row " << i;
    }
  }
}

TEST(Kmeans, MoreCentroidsThanPointsAndDuplicates) {
  std::vector<float> x(5 * 4, 1.0f);  // five identical points
  std::vector<float> cen;
  std::vector<int> assign;
  kmeans(x.data(), 5, 4, 4, nullptr, 256, 3, 1, &cen, &assign);
  EXPECT_EQ(cen.size(), 5u * 4);  // k clamped to n
  for (float v : cen) EXPECT_EQ(v, 1.0f);
}

TEST(Kmeans, TrimmedUpdateIgnoresAHugeOutlierWithOneCentroid) {
  std::mt19937 rng(4);
  auto x = testing_util::randn(64 * 8, rng);
  x[5 * 8 + 2] = 1e4f;
  std::vector<float> cen;
  std::vector<int> assign;
  kmeans(x.data(), 64, 8, 8, nullptr, 1, 4, 1, &cen, &assign);
  EXPECT_LT(std::fabs(cen[2]), 1.0f);  // the plain mean would be ~156
}

TEST(Kmeans, WeightsChangeTheGeometry) {
  // two groups that differ only in channel 1; with channel 1's weight tiny the
  // assignment follows channel 0 instead
  std::vector<float> x;
  for (int i = 0; i < 40; ++i) {
    x.push_back(i < 20 ? 0.0f : 1.0f);         // channel 0: small split
    x.push_back((i % 2) == 0 ? -10.0f : 10.0f);  // channel 1: large split
  }
  std::vector<float> cen;
  std::vector<int> a;
  const float w[2] = {1.0f, 1e-6f};
  kmeans(x.data(), 40, 2, 2, w, 2, 10, 3, &cen, &a);
  for (int i = 1; i < 20; ++i) EXPECT_EQ(a[static_cast<size_t>(i)], a[0]);
  for (int i = 20; i < 40; ++i) EXPECT_NE(a[static_cast<size_t>(i)], a[0]);
}

// the distances in vector lanes are wdist's (kmeans_ops.h) bit for bit:
// odd row counts and widths, weights or none, ties, values whose squares
// overflow, NaN and infinities among the rows and the centroids
TEST(Kmeans, RowDistancesAreWdistsBitForBit) {
  std::mt19937 rng(11);
  for (const int d : {2, 3, 64, 128})
    for (const int n : {1, 7, 8, 9, 37, 100}) {
      SCOPED_TRACE("d " + std::to_string(d) + " n " + std::to_string(n));
      const int stride = d + 3, k = 13;
      std::vector<float> x = testing_util::randn(static_cast<size_t>(n) * stride, rng, 3.0f);
      std::vector<float> cen = testing_util::randn(static_cast<size_t>(k) * d, rng, 3.0f);
      std::copy(cen.begin(), cen.begin() + d, cen.begin() + 2 * d);  // centroids 0 and 2 tie
      std::copy(x.begin(), x.begin() + d, cen.begin() + 5 * d);      // row 0 sits on centroid 5
      if (n > 3) {
        x[static_cast<size_t>(stride) + 1] = 1e30f;  // row 1: its square overflows
        x[2 * static_cast<size_t>(stride)] = NAN;
        x[3 * static_cast<size_t>(stride) + d - 1] = -INFINITY;
      }
      cen[7 * static_cast<size_t>(d)] = INFINITY;
      std::vector<float> w = testing_util::randn(static_cast<size_t>(d), rng);
      for (float& v : w) v = std::abs(v) + 0.01f;
      for (const float* weights : {static_cast<const float*>(nullptr), static_cast<const float*>(w.data())}) {
        const RowDistances rows(x.data(), n, d, stride, weights);
        for (int j = 0; j < k; ++j) {
          std::vector<float> got(static_cast<size_t>(n));
          rows.to_one(cen.data() + static_cast<size_t>(j) * d, got.data());
          for (int i = 0; i < n; ++i) {
            const float want = kmeans_ops::finite_or_max(
                kmeans_ops::wdist(x.data() + static_cast<size_t>(i) * stride, cen.data() + static_cast<size_t>(j) * d,
                                  weights, d));
            ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]), std::bit_cast<uint32_t>(want))
                << "row " << i << " centroid " << j << (weights ? " weighted" : "");
          }
        }
        for (const int kk : {1, 4, 5, k}) {
          std::vector<int> best(static_cast<size_t>(n), -1);
          std::vector<float> dist(static_cast<size_t>(n));
          rows.nearest(cen.data(), kk, best.data(), dist.data());
          for (int i = 0; i < n; ++i) {
            int b = 0;
            float bd = INFINITY;
            for (int j = 0; j < kk; ++j) {
              const float dj = kmeans_ops::finite_or_max(kmeans_ops::wdist(
                  x.data() + static_cast<size_t>(i) * stride, cen.data() + static_cast<size_t>(j) * d, weights, d));
              if (dj < bd) {
                bd = dj;
                b = j;
              }
            }
            ASSERT_EQ(best[static_cast<size_t>(i)], b) << "row " << i << " of " << kk << (weights ? " weighted" : "");
            ASSERT_EQ(std::bit_cast<uint32_t>(dist[static_cast<size_t>(i)]), std::bit_cast<uint32_t>(bd));
          }
        }
      }
    }
}

TEST(Kmeans, NearestCentroidsSortedWithTies) {
  const float c[] = {0, 0, 1, 0, -1, 0, 3, 0};  // four 2-d centroids
  const float x[] = {0.0f, 0.0f};
  int idx[3];
  float dist[3];
  ASSERT_EQ(nearest_centroids(x, 2, nullptr, c, 4, 3, idx, dist), 3);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);  // tie between 1 and 2: smaller index first
  EXPECT_EQ(idx[2], 2);
}

}  // namespace
}  // namespace wm
