// The span formats' coder on the device (span_encode.cuh). k-means'
// arithmetic is quant/kmeans_ops.h's, shared with the host; every other
// function here mirrors one of quant/kmeans.cc, quant/span_codec.cc or
// quant/kv_layouts.h operation for operation: a change there is a change
// here.
#include <cfloat>

#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/span_encode.cuh"
#include "quant/fp8_e4m3.h"
#include "quant/kmeans_ops.h"
#include "quant/q2_ops.h"

namespace wm::cuda {
namespace {

constexpr int kRank = 8;  // quant/kv_layouts.h: kPsacRank
constexpr int kKmeansThreads = 512;  // the block of a CTA per job (the seeding, the Lloyd updates)
constexpr int kDistGroup = 4;        // distances computed side by side per thread

// the scratch of one job: the clean rows twice (token-major for the
// centroid sums and the codes, channel-major so that a warp's distances
// read consecutive tokens; fp16 holds them exactly), the centroids,
// k-means' state
struct Scratch {
  uint16_t* rows;    // [n][D] fp16
  uint16_t* rows_t;  // [D][n] fp16
  float* cen;        // [min(256, n)][D]
  double* dmin;      // [n]
  double* before;    // [chunks + 1] (chunks: n / kSeedChunk, rounded up): the seeding's chunk totals, then their running sums
  float* dist;       // [n]
  int32_t* assign;   // [n]
  int32_t* members;  // [n], by cluster, each cluster's in token order
  int32_t* start;    // [k + 1]
  int32_t* counts;   // [chunks][k]: each chunk's members per cluster, then its first places
  float* limit;      // [k]
};

__host__ __device__ inline size_t scratch_layout(int32_t n, int32_t d, uint8_t* base, Scratch* s) {
  const size_t kmax = static_cast<size_t>(n < kSpanMaxCentroids ? n : kSpanMaxCentroids);
  const size_t chunks = static_cast<size_t>(n + kmeans_ops::kSeedChunk - 1) / kmeans_ops::kSeedChunk;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base != nullptr ? base + at : nullptr;
    at += (bytes + 15) / 16 * 16;
    return p;
  };
  uint8_t* rows = take(static_cast<size_t>(n) * d * 2);
  uint8_t* rows_t = take(static_cast<size_t>(n) * d * 2);
  uint8_t* cen = take(kmax * d * 4);
  uint8_t* dmin = take(static_cast<size_t>(n) * 8);
  uint8_t* before = take((chunks + 1) * 8);
  uint8_t* dist = take(static_cast<size_t>(n) * 4);
  uint8_t* assign = take(static_cast<size_t>(n) * 4);
  uint8_t* members = take(static_cast<size_t>(n) * 4);
  uint8_t* start = take((kmax + 1) * 4);
  uint8_t* counts = take(chunks * kmax * 4);
  uint8_t* limit = take(kmax * 4);
  if (s != nullptr) {
    s->rows = reinterpret_cast<uint16_t*>(rows);
    s->rows_t = reinterpret_cast<uint16_t*>(rows_t);
    s->cen = reinterpret_cast<float*>(cen);
    s->dmin = reinterpret_cast<double*>(dmin);
    s->before = reinterpret_cast<double*>(before);
    s->dist = reinterpret_cast<float*>(dist);
    s->assign = reinterpret_cast<int32_t*>(assign);
    s->members = reinterpret_cast<int32_t*>(members);
    s->start = reinterpret_cast<int32_t*>(start);
    s->counts = reinterpret_cast<int32_t*>(counts);
    s->limit = reinterpret_cast<float*>(limit);
  }
  return at;
}

__device__ __forceinline__ float f16_round(float x) { return __half2float(__ushort_as_half(f16_bits(x))); }
__device__ __forceinline__ float f16_value(uint16_t h) { return __half2float(__ushort_as_half(h)); }

using kmeans_ops::finite_or_max;
using kmeans_ops::kSeedChunk;
using kmeans_ops::uniform01;

// G weighted distances (kmeans_ops.h: wdist, with its overflow guard) of
// tokens tok[g] to centroids cen[g], side by side: each summed in channel
// order as wdist sums it, the tokens read from the channel-major rows, the
// centroids (16-byte aligned rows of d, a multiple of 4) 4 channels a load
template <int G, bool Weighted>
__device__ __forceinline__ void wdists_as(const Scratch& s, int n, int d, const float* w, const int (&tok)[G],
                                          const float* const (&cen)[G], float (&out)[G]) {
  float acc[G];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = 0.0f;
  auto add = [&](float& a, int c, int i, float m) {
    const float t = f16_value(s.rows_t[static_cast<size_t>(c) * n + i]) - m;
    if (Weighted)
      a += w[c] * t * t;
    else
      a += t * t;
  };
  for (int c = 0; c < d; c += 4) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float4 cv = *reinterpret_cast<const float4*>(cen[g] + c);
      add(acc[g], c, tok[g], cv.x);
      add(acc[g], c + 1, tok[g], cv.y);
      add(acc[g], c + 2, tok[g], cv.z);
      add(acc[g], c + 3, tok[g], cv.w);
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) out[g] = finite_or_max(acc[g]);
}

template <int G>
__device__ __forceinline__ void wdists(const Scratch& s, int n, int d, const float* w, const int (&tok)[G],
                                       const float* const (&cen)[G], float (&out)[G]) {
  if (w != nullptr)
    wdists_as<G, true>(s, n, d, w, tok, cen, out);
  else
    wdists_as<G, false>(s, n, d, w, tok, cen, out);
}

// token i's distances to centroids j0 .. j0 + kDistGroup - 1 (those past k
// repeat the last one)
__device__ __forceinline__ void centroid_dists(const Scratch& s, int n, int d, const float* w, const float* cens, int k,
                                               int i, int j0, float (&out)[kDistGroup]) {
  int tok[kDistGroup];
  const float* cen[kDistGroup];
#pragma unroll
  for (int g = 0; g < kDistGroup; ++g) {
    tok[g] = i;
    cen[g] = cens + static_cast<size_t>(j0 + g < k ? j0 + g : k - 1) * d;
  }
  wdists(s, n, d, w, tok, cen, out);
}

// kmeans()'s assign_all for token i: its nearest centroid, smaller index on ties
__device__ void assign_token(const Scratch& s, int n, int d, int k, const float* w, int i) {
  int best = 0;
  float bd = INFINITY;
  for (int j0 = 0; j0 < k; j0 += kDistGroup) {
    float dj[kDistGroup];
    centroid_dists(s, n, d, w, s.cen, k, i, j0, dj);
#pragma unroll
    for (int g = 0; g < kDistGroup; ++g)
      if (j0 + g < k && dj[g] < bd) {
        bd = dj[g];
        best = j0 + g;
      }
  }
  s.assign[i] = best;
  s.dist[i] = bd;
}

// the distances of every token to centroid j, into dmin (first: as they
// are; then the smaller), kDistGroup tokens per thread side by side
__device__ void seed_distances(const Scratch& s, int n, int d, const float* w, int j, bool first) {
  const int stride = blockDim.x * kDistGroup;
  for (int i0 = threadIdx.x; i0 < n; i0 += stride) {
    int tok[kDistGroup];
    const float* cen[kDistGroup];
#pragma unroll
    for (int g = 0; g < kDistGroup; ++g) {
      const int i = i0 + g * static_cast<int>(blockDim.x);
      tok[g] = i < n ? i : i0;
      cen[g] = s.cen + static_cast<size_t>(j) * d;
    }
    float dj[kDistGroup];
    wdists(s, n, d, w, tok, cen, dj);
#pragma unroll
    for (int g = 0; g < kDistGroup; ++g) {
      const int i = i0 + g * static_cast<int>(blockDim.x);
      if (i >= n) continue;
      const double v = static_cast<double>(dj[g]);
      if (first || v < s.dmin[i]) s.dmin[i] = v;
    }
  }
  __syncthreads();
}

// centroid j := token i's row
__device__ void take_row(const Scratch& s, int d, int j, int i) {
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    s.cen[static_cast<size_t>(j) * d + c] = f16_value(s.rows[static_cast<size_t>(i) * d + c]);
  __syncthreads();
}

// k-means++ seeding (kmeans.cc), the k centroids into s.cen
__device__ void seed_centroids(const Scratch& s, int n, int d, int k, uint64_t seed, const float* w) {
  __shared__ int pick;
  uint64_t counter = 0;  // thread 0's
  const int chunks = (n + kSeedChunk - 1) / kSeedChunk;
  // k-means++ seeding: the chunks' totals a thread each, then their running
  // sums and the draw in one thread, in the CPU's order (kmeans_ops.h)
  if (threadIdx.x == 0) {
    const int first = static_cast<int>(uniform01(seed, counter++) * n);
    pick = first < n - 1 ? first : n - 1;
  }
  __syncthreads();
  take_row(s, d, 0, pick);
  seed_distances(s, n, d, w, 0, true);
  for (int j = 1; j < k; ++j) {
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int end = (c + 1) * kSeedChunk < n ? (c + 1) * kSeedChunk : n;
      double part = 0;
      for (int i = c * kSeedChunk; i < end; ++i) part += s.dmin[i];
      s.before[c + 1] = part;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      s.before[0] = 0;
      for (int c = 0; c < chunks; ++c) s.before[c + 1] = s.before[c] + s.before[c + 1];
      const double total = s.before[chunks];
      int p = 0;
      if (total > 0 && total <= DBL_MAX) {
        const double target = uniform01(seed, counter++) * total;
        p = n - 1;
        int c = 0;
        while (c < chunks && !(s.before[c + 1] > target)) ++c;
        if (c < chunks) {
          const int end = (c + 1) * kSeedChunk < n ? (c + 1) * kSeedChunk : n;
          double part = 0;
          for (int i = c * kSeedChunk; i < end; ++i) {
            part += s.dmin[i];
            if (s.before[c] + part > target) {
              p = i;
              break;
            }
          }
        }
      } else {  // the farthest, smallest index on ties
        for (int i = 1; i < n; ++i)
          if (s.dmin[i] > s.dmin[p]) p = i;
      }
      pick = p;
    }
    __syncthreads();
    take_row(s, d, j, pick);
    seed_distances(s, n, d, w, j, false);
  }
}

// one Lloyd update (kmeans.cc) from the current assignment: each cluster's
// members in token order, its median distance, the trimmed means
__device__ void update_centroids(const Scratch& s, int n, int d, int k) {
  auto row = [&](int i) { return s.rows + static_cast<size_t>(i) * d; };
  auto cen = [&](int j) { return s.cen + static_cast<size_t>(j) * d; };
  const int chunks = (n + kSeedChunk - 1) / kSeedChunk;
  // members of each cluster in token order: each chunk of kSeedChunk
  // tokens counts its own per cluster, the clusters' running sums over
  // the chunks place each chunk's members, the chunk writes them
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    int32_t* cnt = s.counts + static_cast<size_t>(c) * k;
    for (int j = 0; j < k; ++j) cnt[j] = 0;
    const int end = (c + 1) * kSeedChunk < n ? (c + 1) * kSeedChunk : n;
    for (int i = c * kSeedChunk; i < end; ++i) ++cnt[s.assign[i]];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    int m = 0;
    for (int c = 0; c < chunks; ++c) {
      int32_t& cnt = s.counts[static_cast<size_t>(c) * k + j];
      const int here = cnt;
      cnt = m;  // the chunk's first place in the cluster
      m += here;
    }
    s.start[j + 1] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s.start[0] = 0;
    for (int j = 0; j < k; ++j) s.start[j + 1] += s.start[j];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    int32_t* at = s.counts + static_cast<size_t>(c) * k;
    const int end = (c + 1) * kSeedChunk < n ? (c + 1) * kSeedChunk : n;
    for (int i = c * kSeedChunk; i < end; ++i) {
      const int j = s.assign[i];
      s.members[s.start[j] + at[j]++] = i;
    }
  }
  __syncthreads();
  // each cluster's median distance (nth_element's value at size / 2): the
  // member whose value has at most mid smaller and more than mid not larger
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int j = s.assign[i];
    const int b = s.start[j], m = s.start[j + 1] - b, mid = m / 2;
    const float di = s.dist[i];
    int less = 0, leq = 0;
    for (int t = 0; t < m; ++t) {
      const float dt = s.dist[s.members[b + t]];
      less += dt < di;
      leq += dt <= di;
    }
    // equal values write the same limit
    if (less <= mid && mid < leq) s.limit[j] = 64.0f * di;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < k * d; e += blockDim.x) {
    const int j = e / d, c = e - j * d;
    const int b = s.start[j], m = s.start[j + 1] - b;
    if (m == 0) continue;  // an empty cluster keeps its centroid
    double sum = 0;
    int used = 0;
    for (int t = 0; t < m; ++t) {
      const int i = s.members[b + t];
      if (s.dist[i] > s.limit[j]) continue;
      sum += f16_value(row(i)[c]);
      ++used;
    }
    cen(j)[c] = static_cast<float>(sum / used);
  }
  __syncthreads();
}

// kmeans.cc: nearest_centroids, for token i
__device__ int nearest_centroids(const Scratch& s, int n, int d, const float* w, int i, int k, int m, int* idx,
                                 float* dist) {
  m = m < k ? m : k;
  int have = 0;
  for (int j0 = 0; j0 < k; j0 += kDistGroup) {
    float dg[kDistGroup];
    centroid_dists(s, n, d, w, s.cen, k, i, j0, dg);
#pragma unroll
    for (int g = 0; g < kDistGroup; ++g) {
      if (j0 + g >= k) break;
      const float dj = dg[g];
      int pos = have;
      while (pos > 0 && dj < dist[pos - 1]) --pos;
      if (pos >= m) continue;
      const int last = have < m - 1 ? have : m - 1;
      for (int t = last; t > pos; --t) {
        idx[t] = idx[t - 1];
        dist[t] = dist[t - 1];
      }
      idx[pos] = j0 + g;
      dist[pos] = dj;
      have = have + 1 < m ? have + 1 : m;
    }
  }
  return have;
}

// q2_ops.h: BlockQ2Sym's bytes (the scale byte, then B/4 code bytes), B at
// run time; returns the error
__device__ float q2sym_quantize(const float* x, const float* w, int B, uint8_t* blk) {
  return q2sym_quantize_bytes<kSpanMaxHeadDim>(x, w, B, blk);
}

// kv_layouts.h: psac_quantize_ref, int8 or int4 coefficients with an fp16 scale
__device__ void psac_quantize(const float* alpha, int bits, uint8_t* rec) {
  const int qmax = bits == 8 ? 127 : 7;
  float amax = 0.0f;
  for (int i = 0; i < kRank; ++i) amax = fmaxf(amax, fabsf(kv_sanitize(alpha[i])));
  const uint16_t scale = f16_bits(fminf(65504.0f, amax / static_cast<float>(qmax)));
  rec[0] = static_cast<uint8_t>(scale & 0xff);
  rec[1] = static_cast<uint8_t>(scale >> 8);
  const float s = __half2float(__ushort_as_half(scale));
  for (int i = 0; i < kRank; ++i) {
    int q = s > 0 ? static_cast<int>(lroundf(kv_sanitize(alpha[i]) / s)) : 0;
    q = q < -qmax ? -qmax : (q > qmax ? qmax : q);
    if (bits == 8) {
      rec[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    } else {
      const int sh = (i & 1) * 4;
      if ((i & 1) == 0) rec[2 + i / 2] = 0;
      rec[2 + i / 2] = static_cast<uint8_t>(rec[2 + i / 2] | ((q & 0xf) << sh));
    }
  }
}

__device__ __forceinline__ void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// k of a job, clamped as the CPU's kmeans does
__device__ __forceinline__ int job_centroids(const SpanEncodeJob& J) {
  int k = J.centroids < kSpanMaxCentroids ? J.centroids : kSpanMaxCentroids;
  k = k < J.n ? k : J.n;
  return k > 1 ? k : 1;
}

// the job's centroids rounded to fp16 (the tokens are coded against
// those), into the table in the image of the span's first stored frame,
// with the basis for keys with PSAC
__device__ void finish_centroids(const SpanEncodeArgs& a, const SpanEncodeJob& J, const Scratch& s, int k) {
  const int d = a.head_dim, T = a.tokens_per_frame, frames = (J.n + T - 1) / T;
  const float* basis = J.basis >= 0 ? a.params + J.basis : nullptr;
  int64_t img = -1;
  for (int f = 0; f < frames && img < 0; ++f) img = a.frame_images[J.first_image + f];
  uint8_t* table = img >= 0 ? a.image + img + a.tables_at + static_cast<int64_t>(J.head) * a.table_bytes : nullptr;
  for (int e = threadIdx.x; e < k * d; e += blockDim.x) {
    const uint16_t h = f16_bits(s.cen[e]);
    s.cen[e] = f16_value(h);
    if (table != nullptr) put16(table + (J.side == 0 ? 0 : a.v_table) + 2 * e, h);
  }
  if (J.side == 0 && basis != nullptr && table != nullptr)
    for (int e = threadIdx.x; e < kRank * d; e += blockDim.x) put16(table + a.basis_table + 2 * e, f16_bits(basis[e]));
}

__device__ __forceinline__ const float* job_weights(const SpanEncodeArgs& a, const SpanEncodeJob& J) {
  return J.weights >= 0 && a.params[J.weights + a.head_dim] != 0.0f ? a.params + J.weights : nullptr;
}

// the clean rows and the k-means++ seeding (or the given centroids), one CTA
// per job; a job with given centroids or without Lloyd iterations is
// finished here
__global__ void __launch_bounds__(kKmeansThreads, 1) span_seed_kernel(const SpanEncodeArgs a) {
  const SpanEncodeJob& J = a.jobs[blockIdx.x];
  const int n = J.n, d = a.head_dim;
  Scratch s;
  scratch_layout(n, d, a.scratch + J.scratch, &s);
  // the rows as the CPU codes them: sanitized, rounded to fp16 (the cache's
  // pending frames), sanitized again (the coder's NaN guard: a no-op here);
  // fp16 values, which their bits hold exactly
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int i = e / d, c = e - i * d;
    const uint16_t h = f16_bits(kv_sanitize(f16_round(kv_sanitize(J.x[static_cast<int64_t>(i) * a.row_stride + c]))));
    s.rows[e] = h;
    s.rows_t[static_cast<size_t>(c) * n + i] = h;
  }
  __syncthreads();
  const int k = job_centroids(J);
  if (J.given >= 0) {  // k-means ran elsewhere
    for (int e = threadIdx.x; e < k * d; e += blockDim.x) s.cen[e] = a.given[J.given + e];
    __syncthreads();
    finish_centroids(a, J, s, k);
    return;
  }
  seed_centroids(s, n, d, k, J.seed, job_weights(a, J));
  if (J.iters <= 0) finish_centroids(a, J, s, k);
}

// Lloyd iteration `it`'s assignment, spread over the SMs: CTA (x, job)
// assigns the job's tokens x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x apart
__global__ void span_assign_kernel(const SpanEncodeArgs a, int32_t it) {
  const SpanEncodeJob& J = a.jobs[blockIdx.y];
  if (it >= J.iters || J.given >= 0) return;
  Scratch s;
  scratch_layout(J.n, a.head_dim, a.scratch + J.scratch, &s);
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < J.n;
       i += static_cast<int>(gridDim.x * blockDim.x))
    assign_token(s, J.n, a.head_dim, job_centroids(J), job_weights(a, J), i);
}

// Lloyd iteration `it`'s update, one CTA per job; the last one finishes it
// (kmeans.cc's final assignment is not needed: the tokens are coded
// against the fp16 centroids)
__global__ void __launch_bounds__(kKmeansThreads, 1) span_update_kernel(const SpanEncodeArgs a, int32_t it) {
  const SpanEncodeJob& J = a.jobs[blockIdx.x];
  if (it >= J.iters || J.given >= 0) return;
  Scratch s;
  scratch_layout(J.n, a.head_dim, a.scratch + J.scratch, &s);
  const int k = job_centroids(J);
  update_centroids(s, J.n, a.head_dim, k);
  if (it == J.iters - 1) finish_centroids(a, J, s, k);
}

// each token's centroid, residual and PSAC record: CTA (x, job) codes the
// job's tokens x, x + gridDim.x, ... blockDim.x apart
__global__ void span_code_kernel(const SpanEncodeArgs a) {
  const SpanEncodeJob& J = a.jobs[blockIdx.y];
  const int n = J.n, d = a.head_dim, B = a.block, nb = d / B, T = a.tokens_per_frame;
  const int bb = 1 + B / 4;  // bytes of one residual block
  Scratch s;
  scratch_layout(n, d, a.scratch + J.scratch, &s);
  const float* w = job_weights(a, J);
  const float* basis = J.basis >= 0 ? a.params + J.basis : nullptr;
  const int k = job_centroids(J);
  const int m = J.candidates < k ? J.candidates : k;
  const int mm = m > 1 ? m : 1;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint16_t* xi = s.rows + static_cast<size_t>(i) * d;
    int cand[kSpanMaxCandidates];
    float cdist[kSpanMaxCandidates];
    float resid[kSpanMaxHeadDim];
    uint8_t trial[kSpanMaxHeadDim / 16 * 5], best[kSpanMaxHeadDim / 16 * 5];
    const int have = nearest_centroids(s, n, d, w, i, k, mm, cand, cdist);
    float best_err = INFINITY;
    int best_id = cand[0];
    for (int t = 0; t < have; ++t) {
      const float* cj = s.cen + static_cast<size_t>(cand[t]) * d;
      for (int c = 0; c < d; ++c) resid[c] = f16_value(xi[c]) - cj[c];
      float err = 0.0f;
      for (int b = 0; b < nb; ++b) err += q2sym_quantize(resid + b * B, w != nullptr ? w + b * B : nullptr, B, trial + b * bb);
      if (err < best_err || t == 0) {
        best_err = err;
        best_id = cand[t];
        for (int x = 0; x < nb * bb; ++x) best[x] = trial[x];
      }
    }
    const int64_t img = a.frame_images[J.first_image + i / T];
    if (img < 0) continue;
    uint8_t* rec = a.image + img + (static_cast<int64_t>(J.head) * T + i % T) * a.token_bytes;
    for (int x = 0; x < nb * bb; ++x) rec[J.side * a.rec_bytes + x] = best[x];
    rec[2 * a.rec_bytes + J.side] = static_cast<uint8_t>(best_id);
    if (J.side != 0 || basis == nullptr) continue;
    // PSAC: what centroid + residual leave, projected on the basis
    const float* cj = s.cen + static_cast<size_t>(best_id) * d;
    float deq[kSpanMaxHeadDim];
    for (int b = 0; b < nb; ++b) {
      q2sym_dequantize_bytes(best + b * bb, B, deq);
      for (int c = 0; c < B; ++c) resid[b * B + c] = f16_value(xi[b * B + c]) - cj[b * B + c] - deq[c];
    }
    float alpha[kRank];
    for (int r = 0; r < kRank; ++r) {
      double acc = 0;
      for (int c = 0; c < d; ++c) acc += static_cast<double>(basis[static_cast<size_t>(r) * d + c]) * resid[c];
      alpha[r] = static_cast<float>(acc);
    }
    psac_quantize(alpha, a.coeff_bits, rec + 2 * a.rec_bytes + 2);
  }
}

}  // namespace

size_t span_encode_scratch_bytes(int32_t n, int32_t head_dim) { return scratch_layout(n, head_dim, nullptr, nullptr); }

cudaError_t launch_span_encode(const SpanEncodeArgs& a, cudaStream_t stream) {
  if (a.n_jobs <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kSpanMaxHeadDim || a.block <= 0 || a.head_dim % a.block != 0 ||
      a.block % 4 != 0 || a.tokens_per_frame <= 0 || (a.coeff_bits != 8 && a.coeff_bits != 4) || a.host_jobs == nullptr ||
      a.n_jobs > 65535 || a.threads < 0 || a.threads > kKmeansThreads ||
      (a.threads % 32 != 0 && a.threads != 1))
    return cudaErrorInvalidValue;
  int32_t most = 0, iters = 0;  // tokens of the longest job, the most Lloyd iterations (the host's copy of the jobs)
  for (int32_t j = 0; j < a.n_jobs; ++j) {
    const SpanEncodeJob& J = a.host_jobs[j];
    if (J.given >= 0 && a.given == nullptr) return cudaErrorInvalidValue;
    most = J.n > most ? J.n : most;
    if (J.given < 0) iters = J.iters > iters ? J.iters : iters;
  }
  const dim3 jobs(static_cast<unsigned>(a.n_jobs));
  // the token-parallel kernels: a CTA per kThreads tokens, or one per job of a.threads
  const int spread = a.threads > 0 ? a.threads : kThreads, kmeans = a.threads > 0 ? a.threads : kKmeansThreads;
  const unsigned chunks = a.threads > 0 ? 1u : static_cast<unsigned>((most + kThreads - 1) / kThreads);
  if (const cudaError_t e = launch_kernel(span_seed_kernel, jobs, kmeans, 0, stream, a); e != cudaSuccess)
    return e;
  for (int32_t it = 0; it < iters; ++it) {
    if (const cudaError_t e = launch_kernel(span_assign_kernel, dim3(chunks, jobs.x), spread, 0, stream, a, it);
        e != cudaSuccess)
      return e;
    if (const cudaError_t e = launch_kernel(span_update_kernel, jobs, kmeans, 0, stream, a, it); e != cudaSuccess)
      return e;
  }
  return launch_kernel(span_code_kernel, dim3(chunks, static_cast<unsigned>(a.n_jobs)), spread, 0, stream, a);
}

}  // namespace wm::cuda
