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

// the m nearest centroids of one row x [d] (ascending distance, smaller index
// on ties); returns how many were written (min(m, k))
int nearest_centroids(const float* x, int d, const float* w, const float* centroids, int k, int m, int* idx,
                      float* dist);

}  // namespace wm
