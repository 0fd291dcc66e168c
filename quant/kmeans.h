// Seeded, deterministic weighted k-means for the span formats.
//
// Distance: sum_c w_c (x_c - m_c)^2 (w null: uniform), which is plain k-means
// on sqrt(w) * x; the centroid update is the plain mean of the members.
// Initialisation is k-means++ driven by a counter-based RNG from `seed`, so
// the same input and seed give the same centroids on any machine and thread
// count. The update is trimmed: a member farther than 8x the cluster's
// median distance does not move its centroid, so one huge outlier cannot
// drag the centroid every other token is coded against (it still gets the
// nearest centroid and codes its own residual).
#pragma once

#include <cstdint>
#include <vector>

namespace wm {

// x: [n, d] rows with stride `stride`; centroids out: [k, d]; assign out:
// [n], each row's nearest final centroid (null: not wanted, which saves the
// last assignment pass)
void kmeans(const float* x, int n, int d, int stride, const float* w, int k, int iters, uint64_t seed,
            std::vector<float>* centroids, std::vector<int>* assign);

// The distances k-means computes most: every row's to one centroid (the
// seeding's) and to its nearest of k (the assignments'), each
// finite_or_max(wdist(row, centroid)) (kmeans_ops.h) bit for bit. With
// AVX2, 8 rows side by side in a vector's lanes, each lane summing its
// row's channels in order with a separate multiply and add, from a
// channel-major copy of the rows made once; else wdist itself.
class RowDistances {
 public:
  static constexpr int kLanes = 8;
  // x: [n, d] rows with stride `stride` (copied with AVX2; else read in
  // place, so it must outlive this); w: [d] channel weights or null, kept
  // by pointer
  RowDistances(const float* x, int n, int d, int stride, const float* w);
  // out[i]: row i's distance to m [d]
  void to_one(const float* m, float* out) const;
  // best[i], dist[i]: row i's nearest of the k centroids [k][d], the
  // smaller index on ties (index order, strict <), and its distance
  void nearest(const float* centroids, int k, int* best, float* dist) const;

 private:
  int n_, d_;
  const float* x_;
  int stride_;
  const float* w_;
  int groups_ = 0;        // of kLanes rows
  std::vector<float> t_;  // [groups][d][kLanes]; rows past n are zero
};

// the m nearest centroids of one row x [d] (ascending distance, smaller index
// on ties); returns how many were written (min(m, k))
int nearest_centroids(const float* x, int d, const float* w, const float* centroids, int k, int m, int* idx,
                      float* dist);
// the same from a row's distances to the k centroids, computed before
// (RowDistances::to_one): distances[j * stride] is centroid j's
int nearest_of(const float* distances, int64_t stride, int k, int m, int* idx, float* dist);

}  // namespace wm
