#include "quant/kmeans.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "quant/kmeans_ops.h"

namespace wm {
using kmeans_ops::finite_or_max;
using kmeans_ops::kSeedChunk;
using kmeans_ops::uniform01;
using kmeans_ops::wdist;

void kmeans(const float* x, int n, int d, int stride, const float* w, int k, int iters, uint64_t seed,
            std::vector<float>* centroids, std::vector<int>* assign) {
  k = std::max(1, std::min(k, n));
  centroids->assign(static_cast<size_t>(k) * d, 0.0f);
  std::vector<int> own;
  const bool wanted = assign != nullptr;
  if (!wanted) assign = &own;
  assign->assign(static_cast<size_t>(n), 0);
  if (n == 0) return;
  auto row = [&](int i) { return x + static_cast<size_t>(i) * stride; };
  auto cen = [&](int j) { return centroids->data() + static_cast<size_t>(j) * d; };

  // k-means++ seeding
  uint64_t counter = 0;
  int first = static_cast<int>(uniform01(seed, counter++) * n);
  first = std::min(first, n - 1);
  std::copy(row(first), row(first) + d, cen(0));
  std::vector<double> dmin(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) dmin[static_cast<size_t>(i)] = finite_or_max(wdist(row(i), cen(0), w, d));
  // the running totals of the chunks (kmeans_ops.h: kSeedChunk)
  const int chunks = (n + kSeedChunk - 1) / kSeedChunk;
  std::vector<double> before(static_cast<size_t>(chunks) + 1);
  for (int j = 1; j < k; ++j) {
    for (int c = 0; c < chunks; ++c) {
      double part = 0;
      for (int i = c * kSeedChunk; i < std::min(n, (c + 1) * kSeedChunk); ++i) part += dmin[static_cast<size_t>(i)];
      before[static_cast<size_t>(c) + 1] = before[static_cast<size_t>(c)] + part;
    }
    const double total = before[static_cast<size_t>(chunks)];
    int pick = 0;
    if (total > 0 && std::isfinite(total)) {
      const double target = uniform01(seed, counter++) * total;
      pick = n - 1;
      // the first chunk whose running total passes the target, then the
      // first point in it whose running sum does (its last one's is that total)
      int c = 0;
      while (c < chunks && !(before[static_cast<size_t>(c) + 1] > target)) ++c;
      if (c < chunks) {
        double part = 0;
        for (int i = c * kSeedChunk; i < std::min(n, (c + 1) * kSeedChunk); ++i) {
          part += dmin[static_cast<size_t>(i)];
          if (before[static_cast<size_t>(c)] + part > target) {
            pick = i;
            break;
          }
        }
      }
    } else {
      // every point coincides with a chosen centroid (or distances overflow):
      // take the farthest one, smallest index on ties
      pick = static_cast<int>(std::max_element(dmin.begin(), dmin.end()) - dmin.begin());
    }
    std::copy(row(pick), row(pick) + d, cen(j));
    for (int i = 0; i < n; ++i)
      dmin[static_cast<size_t>(i)] = std::min(dmin[static_cast<size_t>(i)],
                                              static_cast<double>(finite_or_max(wdist(row(i), cen(j), w, d))));
  }

  std::vector<float> dist(static_cast<size_t>(n));
  auto assign_all = [&]() {
    for (int i = 0; i < n; ++i) {
      int best = 0;
      float bd = std::numeric_limits<float>::infinity();
      for (int j = 0; j < k; ++j) {
        const float dj = finite_or_max(wdist(row(i), cen(j), w, d));
        if (dj < bd) {
          bd = dj;
          best = j;
        }
      }
      (*assign)[static_cast<size_t>(i)] = best;
      dist[static_cast<size_t>(i)] = bd;
    }
  };
  if (iters > 0 || wanted) assign_all();
  std::vector<std::vector<int>> members(static_cast<size_t>(k));
  std::vector<float> scratch;
  std::vector<double> sum(static_cast<size_t>(d));
  for (int it = 0; it < iters; ++it) {
    for (auto& m : members) m.clear();
    for (int i = 0; i < n; ++i) members[static_cast<size_t>((*assign)[static_cast<size_t>(i)])].push_back(i);
    for (int j = 0; j < k; ++j) {
      const auto& m = members[static_cast<size_t>(j)];
      if (m.empty()) continue;  // an empty cluster keeps its centroid
      scratch.clear();
      for (int i : m) scratch.push_back(dist[static_cast<size_t>(i)]);
      const size_t mid = scratch.size() / 2;
      std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(mid), scratch.end());
      const float limit = 64.0f * scratch[mid];  // squared distance: 8x the median distance
      std::fill(sum.begin(), sum.end(), 0.0);
      int used = 0;
      for (int i : m) {
        if (dist[static_cast<size_t>(i)] > limit) continue;
        const float* r = row(i);
        for (int c = 0; c < d; ++c) sum[static_cast<size_t>(c)] += r[c];
        ++used;
      }
      for (int c = 0; c < d; ++c) cen(j)[c] = static_cast<float>(sum[static_cast<size_t>(c)] / used);
    }
    if (it + 1 < iters || wanted) assign_all();
  }
}

int nearest_centroids(const float* x, int d, const float* w, const float* centroids, int k, int m, int* idx,
                      float* dist) {
  m = std::min(m, k);
  int have = 0;
  for (int j = 0; j < k; ++j) {
    const float dj = finite_or_max(wdist(x, centroids + static_cast<size_t>(j) * d, w, d));
    // insertion into the sorted top-m list; strict < keeps the smaller index on ties
    int pos = have;
    while (pos > 0 && dj < dist[pos - 1]) --pos;
    if (pos >= m) continue;
    const int last = std::min(have, m - 1);
    for (int t = last; t > pos; --t) {
      idx[t] = idx[t - 1];
      dist[t] = dist[t - 1];
    }
    idx[pos] = j;
    dist[pos] = dj;
    have = std::min(have + 1, m);
  }
  return have;
}

}  // namespace wm
