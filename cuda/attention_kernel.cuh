// The fused attention kernel, once, for both tensor-core generations: the
// matrix products come from an Mma policy type, the cache from a format
// type (STYLE.md 5). attention.cu instantiates it with SyncMma (mma.sync,
// sm_80+), attention_sm90.cu with WgMma (Hopper's warpgroup MMA, sm_90a).
//
// One CTA per (work item, head) of an AttentionPlan (blockIdx.x, blockIdx.y):
// BQ query rows of one session against a range of its key tiles of 64 keys,
// first the cache's (paged) then the session's own block. Q is loaded once
// into registers (per warp, 16 rows as m16n8k16 A fragments); K/V tiles are
// double-buffered in shared memory with cp.async (zero-filled past the valid
// keys); each tile: S = Q K^T, mask, online softmax in registers (log2
// units), O += P V; the epilogue writes the normalised rows or a split
// partial. Block-causal: every query of a block sees the whole cache and its
// whole own block, nothing else.
//
// An Mma policy provides:
//   kThreads(BQ), kMinCtas(BQ)   launch bounds
//   kPanel                       K/V tiles in the wgmma layout (mma_layout.h: panel_swz)
//   kAlign                       alignment of the first K/V stage in shared memory
//   smem_fence()                 after the copies land, before the products read them
//   qk<HD, BK>(sc, qf, sk, lane) S = Q K^T for this thread's accumulators
//   pv<HD, BK>(o, sc, sv, lane)  O += P V, P = the probabilities in sc
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention.cuh"
#include "cuda/attention_tile.cuh"
#include "cuda/kv_format_fp16.cuh"
#include "cuda/kv_layout.h"
#include "cuda/mma.cuh"

namespace wm::cuda {

// dynamic shared memory of one CTA: alignment slack, two stages of K and V
// tiles, the query tile
template <class Mma>
constexpr size_t attention_kernel_smem(int32_t head_dim, int32_t block_q) {
  return (Mma::kAlign > 16 ? Mma::kAlign : 0) + static_cast<size_t>(4 * kTileKeys + block_q) * head_dim * 2;
}

// Shared memory: two stages of K [BK][HD] then V [BK][HD] (stage s at
// stages + 2 s kTileBytes), from the first kAlign boundary; then Q [BQ][HD]
// (swz layout, read by ldmatrix).
template <class Mma, class Fmt, int HD, int BQ>
__global__ void __launch_bounds__(Mma::kThreads(BQ), Mma::kMinCtas(BQ))
    attention_kernel(const AttentionArgs a, const typename Fmt::View kv) {
  constexpr int BK = kTileKeys, NT = Mma::kThreads(BQ);
  constexpr uint32_t kTileBytes = BK * HD * 2;
  static_assert(kTileBytes % Mma::kAlign == 0, "every stage starts on an alignment boundary");
  const uint32_t stages = (dynamic_smem_addr() + Mma::kAlign - 1) & ~(Mma::kAlign - 1);
  const uint32_t sq = stages + 4 * kTileBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const ItemContext c = item_context(a, kv, BQ);
  auto issue = [&](int tile, int stage) {
    const uint32_t sk = stages + stage * 2 * kTileBytes, sv = sk + kTileBytes;
    load_key_tile<Fmt, HD, NT, Mma::kPanel>(a, kv, c, tile, sk, sv, tid);
  };

  // prologue: the query tile and the first key tile in one group
  load_query_tile<HD, BQ, NT>(a, c, sq, tid);
  const int n_tiles = c.w.tile_end - c.w.tile_begin;
  if (n_tiles > 0) issue(c.w.tile_begin, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[HD / 16][4];
  query_fragments<HD>(sq, warp, lane, qf);

  float o[HD / 8][4], m[2], l[2];  // output, running max of scaled logits (log2 units), this thread's sum
  start_rows<HD>(o, m, l);

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    if (it + 1 < n_tiles) issue(c.w.tile_begin + it + 1, stage ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning tile `it`
    cp_async_wait<1>();
    Mma::smem_fence();
    __syncthreads();
    const uint32_t sk = stages + stage * 2 * kTileBytes, sv = sk + kTileBytes;
    const int valid = tile_ref(c.s, c.cached, c.w.tile_begin + it).valid;

    float sc[BK / 8][4];
    Mma::template qk<HD, BK>(sc, qf, sk, lane);
    online_softmax_tile<BK, HD>(sc, o, m, l, valid, a.scale_log2, lane);
    Mma::template pv<HD, BK>(o, sc, sv, lane);
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }

  store_rows<HD, BQ>(a, c, warp, lane, o, m, l);
}

// A kernel family for the host side: the kernel for (HD, BQ) over a cache
// format (the fp16 pages by default), its threads and its dynamic shared
// memory. This one is attention_kernel with an Mma policy;
// attention_sm90.cu has another.
template <class Mma, class Fmt = Fp16PageFormat>
struct PlainAttention {
  using View = typename Fmt::View;
  template <int HD, int BQ>
  static constexpr auto kernel() {
    return attention_kernel<Mma, Fmt, HD, BQ>;
  }
  static constexpr int threads(int bq) { return Mma::kThreads(bq); }
  static constexpr size_t smem(int32_t hd, int32_t bq) { return attention_kernel_smem<Mma>(hd, bq); }
};

}  // namespace wm::cuda
