#include "quant/kmeans.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "quant/kmeans_ops.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace wm {
using kmeans_ops::finite_or_max;
using kmeans_ops::kSeedChunk;
using kmeans_ops::uniform01;
using kmeans_ops::wdist;

namespace {

#if defined(__AVX2__)
constexpr int kLanes = RowDistances::kLanes;

// G (row group, centroid) pairs' distances at once: G independent sums
template <int G>
void side_by_side(const float* const (&rows)[G], const float* const (&cen)[G], const float* w, int d,
                  __m256 (&out)[G]) {
  __m256 s[G];
  for (int t = 0; t < G; ++t) s[t] = _mm256_setzero_ps();
  if (w == nullptr) {
    for (int c = 0; c < d; ++c)
      for (int t = 0; t < G; ++t) {
        const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(rows[t] + c * kLanes), _mm256_set1_ps(cen[t][c]));
        s[t] = _mm256_add_ps(s[t], _mm256_mul_ps(v, v));
      }
  } else {
    for (int c = 0; c < d; ++c) {
      const __m256 wc = _mm256_set1_ps(w[c]);
      for (int t = 0; t < G; ++t) {
        const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(rows[t] + c * kLanes), _mm256_set1_ps(cen[t][c]));
        s[t] = _mm256_add_ps(s[t], _mm256_mul_ps(_mm256_mul_ps(wc, v), v));
      }
    }
  }
  // finite_or_max: |s| <= FLT_MAX, else FLT_MAX
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), most = _mm256_set1_ps(FLT_MAX);
  for (int t = 0; t < G; ++t)
    out[t] = _mm256_blendv_ps(most, s[t], _mm256_cmp_ps(_mm256_and_ps(s[t], abs_mask), most, _CMP_LE_OQ));
}
#endif

}  // namespace

RowDistances::RowDistances(const float* x, int n, int d, int stride, const float* w)
    : n_(n), d_(d), x_(x), stride_(stride), w_(w) {
#if defined(__AVX2__)
  groups_ = (n + kLanes - 1) / kLanes;
  t_.assign(static_cast<size_t>(groups_) * d * kLanes, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c)
      t_[(static_cast<size_t>(i / kLanes) * d + c) * kLanes + i % kLanes] = x[static_cast<size_t>(i) * stride + c];
#endif
}

void RowDistances::to_one(const float* m, float* out) const {
#if defined(__AVX2__)
  const auto group = [this](int g) { return t_.data() + static_cast<size_t>(g) * d_ * kLanes; };
  const auto store = [&](int g, __m256 r) {
    alignas(32) float v[kLanes];
    _mm256_store_ps(v, r);
    for (int l = 0; l < kLanes && g * kLanes + l < n_; ++l) out[g * kLanes + l] = v[l];
  };
  int g = 0;
  for (; g + 4 <= groups_; g += 4) {
    const float* rows[4] = {group(g), group(g + 1), group(g + 2), group(g + 3)};
    const float* cen[4] = {m, m, m, m};
    __m256 r[4];
    side_by_side<4>(rows, cen, w_, d_, r);
    for (int t = 0; t < 4; ++t) store(g + t, r[t]);
  }
  for (; g < groups_; ++g) {
    const float* rows[1] = {group(g)};
    const float* cen[1] = {m};
    __m256 r[1];
    side_by_side<1>(rows, cen, w_, d_, r);
    store(g, r[0]);
  }
#else
  for (int i = 0; i < n_; ++i) out[i] = finite_or_max(wdist(x_ + static_cast<size_t>(i) * stride_, m, w_, d_));
#endif
}

void RowDistances::nearest(const float* cens, int k, int* best, float* dist) const {
#if defined(__AVX2__)
  for (int g = 0; g < groups_; ++g) {
    const float* rows = t_.data() + static_cast<size_t>(g) * d_ * kLanes;
    __m256 bd = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    __m256 bj = _mm256_setzero_ps();  // the index, as a float (exact below 2^24)
    const auto fold = [&](const __m256 dj, int index) {
      const __m256 closer = _mm256_cmp_ps(dj, bd, _CMP_LT_OQ);
      bd = _mm256_blendv_ps(bd, dj, closer);
      bj = _mm256_blendv_ps(bj, _mm256_set1_ps(static_cast<float>(index)), closer);
    };
    int j = 0;
    for (; j + 4 <= k; j += 4) {
      const float* r4[4] = {rows, rows, rows, rows};
      const float* cen[4];
      for (int t = 0; t < 4; ++t) cen[t] = cens + static_cast<size_t>(j + t) * d_;
      __m256 r[4];
      side_by_side<4>(r4, cen, w_, d_, r);
      for (int t = 0; t < 4; ++t) fold(r[t], j + t);
    }
    for (; j < k; ++j) {
      const float* r1[1] = {rows};
      const float* cen[1] = {cens + static_cast<size_t>(j) * d_};
      __m256 r[1];
      side_by_side<1>(r1, cen, w_, d_, r);
      fold(r[0], j);
    }
    alignas(32) float d8[kLanes], j8[kLanes];
    _mm256_store_ps(d8, bd);
    _mm256_store_ps(j8, bj);
    for (int l = 0; l < kLanes && g * kLanes + l < n_; ++l) {
      dist[g * kLanes + l] = d8[l];
      best[g * kLanes + l] = static_cast<int>(j8[l]);
    }
  }
#else
  for (int i = 0; i < n_; ++i) {
    int b = 0;
    float bd = std::numeric_limits<float>::infinity();
    for (int j = 0; j < k; ++j) {
      const float dj =
          finite_or_max(wdist(x_ + static_cast<size_t>(i) * stride_, cens + static_cast<size_t>(j) * d_, w_, d_));
      if (dj < bd) {
        bd = dj;
        b = j;
      }
    }
    best[i] = b;
    dist[i] = bd;
  }
#endif
}

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
  const RowDistances distances(x, n, d, stride, w);
  std::vector<float> dist(static_cast<size_t>(n));
  distances.to_one(cen(0), dist.data());
  std::vector<double> dmin(dist.begin(), dist.end());
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
    distances.to_one(cen(j), dist.data());
    for (int i = 0; i < n; ++i)
      dmin[static_cast<size_t>(i)] =
          std::min(dmin[static_cast<size_t>(i)], static_cast<double>(dist[static_cast<size_t>(i)]));
  }

  auto assign_all = [&]() { distances.nearest(centroids->data(), k, assign->data(), dist.data()); };
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

namespace {

// the m smallest of the k distances distance_of(j), ascending, the smaller
// index on ties
template <class Distance>
int smallest(Distance distance_of, int k, int m, int* idx, float* dist) {
  m = std::min(m, k);
  int have = 0;
  for (int j = 0; j < k; ++j) {
    const float dj = distance_of(j);
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

}  // namespace

int nearest_centroids(const float* x, int d, const float* w, const float* centroids, int k, int m, int* idx,
                      float* dist) {
  return smallest([&](int j) { return finite_or_max(wdist(x, centroids + static_cast<size_t>(j) * d, w, d)); }, k, m,
                  idx, dist);
}

int nearest_of(const float* distances, int64_t stride, int k, int m, int* idx, float* dist) {
  return smallest([&](int j) { return distances[static_cast<int64_t>(j) * stride]; }, k, m, idx, dist);
}

}  // namespace wm
