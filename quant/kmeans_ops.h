// The arithmetic of the span formats' k-means (kmeans.cc) that its device
// twin (cuda/span_encode.cu) must repeat exactly: the counter-based draw,
// the weighted distance and its overflow guard. Host and device; built
// without fused multiply-adds on both sides (quant/CMakeLists.txt).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/hd.h"

namespace wm::kmeans_ops {

WM_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// uniform in [0, 1) from (seed, counter)
WM_HD inline double uniform01(uint64_t seed, uint64_t counter) {
  return static_cast<double>(mix64(seed ^ mix64(counter)) >> 11) * 0x1.0p-53;
}

// sum_c w_c (a_c - b_c)^2 (w null: uniform), summed in channel order
WM_HD inline float wdist(const float* a, const float* b, const float* w, int d) {
  float s = 0.0f;
  if (w == nullptr) {
    for (int c = 0; c < d; ++c) {
      const float t = a[c] - b[c];
      s += t * t;
    }
  } else {
    for (int c = 0; c < d; ++c) {
      const float t = a[c] - b[c];
      s += w[c] * t * t;
    }
  }
  return s;
}

// k-means++ seeding sums its distances in chunks of this many points: each
// chunk's in point order from zero, then the chunks' totals in order; the
// draw's running sum at point i is (the totals of the chunks before i's) +
// (i's chunk up to i). The device sums the chunks a thread each, so that
// the sequential part of a draw is n / kSeedChunk + kSeedChunk additions,
// not 2 n.
inline constexpr int kSeedChunk = 32;

// distances are compared in float; a non-finite one (overflow on absurd
// inputs) sorts last instead of breaking the ordering
WM_HD inline float finite_or_max(float x) { return fabsf(x) <= FLT_MAX ? x : FLT_MAX; }

}  // namespace wm::kmeans_ops
