#include "cuda/kv_probe.cuh"

#include <cmath>

#include "cuda/kv_format_fp16.cuh"
#include "cuda/kv_format_kivi.cuh"
#include "cuda/kv_format_span.cuh"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"

namespace wm::cuda {
namespace {

constexpr int kProbeThreads = 128;

// channels 8c..8c+7 of key (or value) row r: from the tile the format
// decoded into shared memory (swz layout), or from the block's fp32 rows
template <int HD>
__device__ __forceinline__ void row8(bool from_cache, uint32_t tile, const float* rows, int r, int c, float (&x)[8]) {
  if (from_cache) {
    const uint4 w = ld_shared_16(tile + swz<HD>(r, c));
    const uint32_t h[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] = __half2float(__ushort_as_half(static_cast<unsigned short>((h[e / 2] >> (16 * (e & 1))) & 0xffffu)));
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = rows[c * 8 + e];
  }
}

// CTA (tile, head): the tile's keys and values (decoded into shared memory,
// or the block's rows), then for each sample of this head its logits (the
// cache's are written out) and the tile's softmax partial: max, sum of
// exp(logit - max), and the sum of those weights times the values
template <class Fmt, int HD>
__global__ void __launch_bounds__(kProbeThreads) probe_tiles_kernel(const ProbeArgs a, const typename Fmt::View kv) {
  constexpr int NT = kProbeThreads;
  const int tid = threadIdx.x, tile = blockIdx.x, head = blockIdx.y;
  const int32_t cache_tiles = block_tiles(a.cached), tiles = cache_tiles + block_tiles(a.n);
  const bool from_cache = tile < cache_tiles;
  const int32_t first = (from_cache ? tile : tile - cache_tiles) * kTileKeys;
  const int32_t valid = clamp_tile_keys((from_cache ? a.cached : a.n) - first);
  const uint32_t sk = dynamic_smem_addr(), sv = sk + kTileKeys * HD * 2;
  if (from_cache) {
    Fmt::template load_tile<HD, NT>(kv, a.page_rows + static_cast<int64_t>(head) * a.pages_per_head, first, valid, sk,
                                    sv, tid);
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  __shared__ float qs[HD];
  __shared__ float s[kTileKeys];
  const int64_t stride = static_cast<int64_t>(a.heads) * HD;
  for (int i = 0; i < a.n_samples; ++i) {
    if (a.samples[2 * i] != head) continue;  // the same for every thread
    const float* qrow = a.q + a.samples[2 * i + 1] * stride + static_cast<int64_t>(head) * HD;
    for (int d = tid; d < HD; d += NT) qs[d] = qrow[d];
    __syncthreads();
    if (tid < kTileKeys) {
      float logit = -INFINITY;
      if (tid < valid) {
        const float* krow = from_cache ? nullptr : a.k_cur + (first + tid) * stride + static_cast<int64_t>(head) * HD;
        float dot = 0.0f;
        for (int c = 0; c < HD / 8; ++c) {
          float x[8];
          row8<HD>(from_cache, sk, krow, tid, c, x);
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qs[c * 8 + e], x[e], dot);
        }
        logit = dot * a.scale;
        if (from_cache) {
          const int32_t token = first + tid, T = a.tokens_per_frame;
          a.logits[static_cast<int64_t>(i) * a.cached + a.slot_rank[token / T] * T + token % T] = logit;
        }
      }
      s[tid] = logit;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int r = 0; r < valid; ++r) m = fmaxf(m, s[r]);
    float* p = a.partial + (static_cast<int64_t>(i) * tiles + tile) * (HD + 2);
    for (int d = tid; d < HD; d += NT) {
      float l = 0.0f, o = 0.0f;
      for (int r = 0; r < valid && m != -INFINITY; ++r) {
        const float w = expf(s[r] - m);
        float x[8];
        const float* vrow = from_cache ? nullptr : a.v_cur + (first + r) * stride + static_cast<int64_t>(head) * HD;
        row8<HD>(from_cache, sv, vrow, r, d / 8, x);
        l += w;
        o = fmaf(w, x[d % 8], o);
      }
      p[2 + d] = o;
      if (d == 0) {
        p[0] = m;
        p[1] = l;
      }
    }
    __syncthreads();  // qs and s are the next sample's
  }
}

// CTA per sample, thread per channel: the partials of its tiles, rescaled
// to their common max, summed and normalised
template <int HD>
__global__ void __launch_bounds__(HD) probe_combine_kernel(const ProbeArgs a) {
  const int i = blockIdx.x, d = threadIdx.x;
  const int32_t tiles = probe_tiles(a.cached, a.n);
  const float* p = a.partial + static_cast<int64_t>(i) * tiles * (HD + 2);
  float mx = -INFINITY;
  for (int t = 0; t < tiles; ++t) mx = fmaxf(mx, p[static_cast<int64_t>(t) * (HD + 2)]);
  float l = 0.0f, o = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    const float* pt = p + static_cast<int64_t>(t) * (HD + 2);
    if (pt[0] == -INFINITY) continue;  // every logit of the tile -inf: it adds nothing
    const float w = expf(pt[0] - mx);
    l = fmaf(w, pt[1], l);
    o = fmaf(w, pt[2 + d], o);
  }
  a.out[static_cast<int64_t>(i) * HD + d] = o / l;
}

// x is neither infinite nor NaN (x - x is NaN for both)
__device__ __forceinline__ bool finite(double x) { return x - x == 0.0; }

// the running top k (k <= K) of one thread's share, or of the merge:
// descending, the earlier token first on ties; values NaN-free
template <int K>
struct TopK {
  float v[K];
  int32_t i[K];
  int n = 0;
  __device__ __forceinline__ void offer(float x, int32_t token, int k) {
    if (n == k && !(x > v[k - 1] || (x == v[k - 1] && token < i[k - 1]))) return;
    int at = n < k ? n : k - 1;
    while (at > 0 && (x > v[at - 1] || (x == v[at - 1] && token < i[at - 1]))) {
      v[at] = v[at - 1];
      i[at] = i[at - 1];
      --at;
    }
    v[at] = x;
    i[at] = token;
    if (n < k) ++n;
  }
};

constexpr int kRankThreads = 128;

// CTA per sample: each thread ranks a strided share of both caches' logits
// and sums the squared differences; then thread 0 merges the shares' top k
template <int K>
__global__ void __launch_bounds__(kRankThreads) probe_rank_kernel(const RankArgs a) {
  static_assert(K <= kProbeMaxTopK, "the shared arrays are sized for kProbeMaxTopK");
  const int s = blockIdx.x, tid = threadIdx.x;
  const float* ref = a.ref + static_cast<int64_t>(s) * a.tokens;
  const float* cand = a.cand + static_cast<int64_t>(s) * a.tokens;
  TopK<K> tr, tc;
  double err = 0.0;
  int32_t nonfinite = 0;
  for (int32_t j = tid; j < a.tokens; j += kRankThreads) {
    const float r = ref[j], c = cand[j];
    nonfinite += finite(r) ? 0 : 1;
    const double e = static_cast<double>(c) - static_cast<double>(r);
    if (finite(e)) err += e * e;
    tr.offer(r == r ? r : -INFINITY, j, a.k);  // NaN last
    tc.offer(c == c ? c : -INFINITY, j, a.k);
  }
  __shared__ float sv[2][kRankThreads][K];
  __shared__ int32_t si[2][kRankThreads][K];
  __shared__ int32_t sn[2][kRankThreads];
  __shared__ double se[kRankThreads];
  __shared__ int32_t sf[kRankThreads];
  for (int e = 0; e < tr.n; ++e) {
    sv[0][tid][e] = tr.v[e];
    si[0][tid][e] = tr.i[e];
  }
  for (int e = 0; e < tc.n; ++e) {
    sv[1][tid][e] = tc.v[e];
    si[1][tid][e] = tc.i[e];
  }
  sn[0][tid] = tr.n;
  sn[1][tid] = tc.n;
  se[tid] = err;
  sf[tid] = nonfinite;
  __syncthreads();
  if (tid != 0) return;
  double total = 0.0;
  int32_t bad = 0;
  for (int t = 0; t < kRankThreads; ++t) {
    total += se[t];
    bad += sf[t];
  }
  a.sq_err[s] = total;
  a.ref_nonfinite[s] = bad;
  for (int side = 0; side < 2; ++side) {
    TopK<K> m;
    for (int t = 0; t < kRankThreads; ++t)
      for (int e = 0; e < sn[side][t]; ++e) m.offer(sv[side][t][e], si[side][t][e], a.k);
    int32_t* top = (side == 0 ? a.ref_top : a.cand_top) + static_cast<int64_t>(s) * a.k;
    for (int e = 0; e < a.k; ++e) top[e] = e < m.n ? m.i[e] : -1;
  }
}

template <class Fmt, int HD>
cudaError_t launch_hd(const ProbeArgs& a, const typename Fmt::View& kv, cudaStream_t stream) {
  const int32_t tiles = probe_tiles(a.cached, a.n);
  const size_t smem = static_cast<size_t>(2) * kTileKeys * HD * 2;  // one K and one V tile, fp16
  cudaError_t e = launch_kernel(probe_tiles_kernel<Fmt, HD>,
                                dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads)), kProbeThreads,
                                smem, stream, a, kv);
  if (e != cudaSuccess) return e;
  return launch_kernel(probe_combine_kernel<HD>, dim3(static_cast<unsigned>(a.n_samples)), HD, 0, stream, a);
}

template <class Fmt>
cudaError_t launch_format(const ProbeArgs& a, const typename Fmt::View& kv, int32_t head_dim, cudaStream_t stream) {
  if (a.n_samples <= 0 || a.heads <= 0 || a.n < 0 || a.cached < 0) return cudaErrorInvalidValue;
  switch (head_dim) {
    case 32:
      return launch_hd<Fmt, 32>(a, kv, stream);
    case 64:
      return launch_hd<Fmt, 64>(a, kv, stream);
    case 128:
      return launch_hd<Fmt, 128>(a, kv, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_probe_rank(const RankArgs& a, cudaStream_t stream) {
  if (a.n_samples <= 0 || a.tokens <= 0 || a.k < 1 || a.k > kProbeMaxTopK || a.k > a.tokens)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.n_samples));
  return a.k <= 8 ? launch_kernel(probe_rank_kernel<8>, grid, kRankThreads, 0, stream, a)
                  : launch_kernel(probe_rank_kernel<kProbeMaxTopK>, grid, kRankThreads, 0, stream, a);
}

cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvFp16View& kv, int32_t head_dim, cudaStream_t stream) {
  return launch_format<Fp16PageFormat>(a, kv, head_dim, stream);
}

cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvKiviView& kv, int32_t head_dim, cudaStream_t stream) {
  return launch_format<KiviPageFormat>(a, kv, head_dim, stream);
}

cudaError_t launch_kv_probe(const ProbeArgs& a, const PagedKvSpanView& kv, int32_t head_dim, cudaStream_t stream) {
  return launch_format<SpanPageFormat>(a, kv, head_dim, stream);
}

}  // namespace wm::cuda
