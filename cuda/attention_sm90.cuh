// The attention kernels on Hopper's warpgroup MMA (wgmma, sm_90a only):
// attention_kernel.cuh with WgMma. One warpgroup (4 warps) per 64 query rows:
// block_q 64 is one, 128 two that share every key tile. Q stays in registers
// as the A operand of S = Q K^T; the K and V tiles are the B operands, read
// by the tensor cores straight from shared memory through descriptors, so
// they are stored in the 128-byte-swizzle layout (mma_layout.h: panel_swz,
// key_desc, value_desc); P is repacked from the S accumulators into the A
// registers of O += P V, as with mma.sync (docs/CUDA.md, "The Hopper kernel").
// Two variants: attention_kernel.cuh's loop (S, softmax, P V in turn), and
// attention_overlap_kernel below, which overlaps each tile's softmax with
// the tensor cores' work.
#pragma once

#include <cstdint>

#include "cuda/attention_kernel.cuh"
#include "cuda/attention_tile.cuh"
#include "cuda/wgmma.cuh"

namespace wm::cuda {

// O += P V over 16 keys: N = HD output channels in one instruction
template <int HD>
__device__ __forceinline__ void pv_mma(float (&o)[HD / 8][4], const uint32_t (&pa)[4], uint64_t desc) {
  if constexpr (HD == 64) {
    wgmma_m64n64k16<1>(o, pa, desc);
  } else {
    wgmma_m64n128k16<1>(o, pa, desc);
  }
}

// a warpgroup's 64 query rows in shared memory, the A operand of S by
// descriptor: rows 64 wg .. 64 wg + 63 of a QR-row panel tile (mma_layout.h:
// panel_swz<HD, QR>), addr the first row's (the tile's start + 64 wg x 128)
template <int QR>
struct QTile {
  uint32_t addr;
};

// compiler fences on Q's registers; Q in shared memory has none
template <int N>
__device__ __forceinline__ void fence_q(uint32_t (&qf)[N][4]) {
  fence_regs(qf);
}
template <int QR>
__device__ __forceinline__ void fence_q(QTile<QR>&) {}

struct WgMma {
  __host__ __device__ static constexpr int kThreads(int bq) { return bq * 2; }  // 128 threads per 64 rows
  __host__ __device__ static constexpr int kMinCtas(int) { return 1; }
  static constexpr bool kPanel = true;
  static constexpr uint32_t kAlign = 1024;  // swizzle groups start on 1024-byte boundaries
  // the cp.async writes become visible to wgmma, which reads through the async proxy
  __device__ static void smem_fence() { fence_proxy_async_smem(); }

  // BK keys are BK / 64 key tiles (kTileKeys) of K from sk and of V from sv.
  // PR (panel rows) kTileKeys: each tile in its own panels, kTileBytes<HD>
  // after the one before (one tile: the overlapped kernel's K, V stage; two:
  // a 128-key step of the warp-specialised kernel as it was first built).
  // PR == BK: the tiles are rows of one BK-row panel tile (mma_layout.h:
  // panel_swz<HD, BK>), so that S takes one m64n{BK}k16 per 16 channels.
  template <int HD>
  static constexpr uint32_t kTileBytes = kTileKeys * HD * 2;

  // issues S = Q K^T: the warpgroup's 64 rows against BK keys, one
  // m64n64k16 per 16 channels and key tile, or one m64n128k16 per 16
  // channels for a 128-row panel tile. The first 16 channels write the
  // scores (scale-d 0) and the others add to them, so sc needs no zeroing
  // first: BK / 2 register moves a thread and step fewer between a step's
  // softmax and its next MMAs.
  template <int HD, int BK, int PR = kTileKeys>
  __device__ static void issue_s(float (&sc)[BK / 8][4], uint32_t (&qf)[HD / 16][4], uint32_t sk) {
    static_assert(BK % kTileKeys == 0, "whole key tiles");
    static_assert(PR == kTileKeys || (PR == BK && BK == 128), "64-row tiles, or one 128-row panel tile");
    if constexpr (PR == BK && BK == 128) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) wgmma_m64n128k16<0>(sc, qf[kk], key_desc<HD, BK>(sk, kk), kk > 0);
    } else {
#pragma unroll
      for (int h = 0; h < BK / kTileKeys; ++h) {
        auto& part = *reinterpret_cast<float(*)[kTileKeys / 8][4]>(&sc[h * kTileKeys / 8][0]);
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
          wgmma_m64n64k16<0>(part, qf[kk], key_desc<HD, kTileKeys>(sk + h * kTileBytes<HD>, kk), kk > 0);
      }
    }
  }

  // issues S as above for one 128-row panel tile of keys, with Q in shared
  // memory too: one m64n128k16 per 16 channels, both operands by
  // descriptor, so that Q takes no registers (32 a thread at head_dim 128)
  template <int HD, int BK, int PR, int QR>
  __device__ static void issue_s(float (&sc)[BK / 8][4], QTile<QR>& q, uint32_t sk) {
    static_assert(PR == BK && BK == 128, "Q from shared memory: one 128-row panel tile of keys");
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_m64n128k16_ss<0>(sc, key_desc<HD, QR>(q.addr, kk), key_desc<HD, BK>(sk, kk), kk > 0);
  }

  // issues O += P V for P already in A registers, one m64n{HD}k16 per 16 keys
  template <int HD, int BK, int PR = kTileKeys>
  __device__ static void issue_pv(float (&o)[HD / 8][4], uint32_t (&pa)[BK / 16][4], uint32_t sv) {
    if constexpr (PR == BK) {
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) pv_mma<HD>(o, pa[kk], value_desc<HD, BK>(sv, kk));
    } else {
      constexpr int kSteps = kTileKeys / 16;  // k-steps per key tile
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        pv_mma<HD>(o, pa[kk], value_desc<HD, kTileKeys>(sv + (kk / kSteps) * kTileBytes<HD>, kk % kSteps));
    }
  }

  // S = Q K^T, waited for; Q: its registers (uint32_t[HD / 16][4]) or a QTile
  template <int HD, int BK, int PR = kTileKeys, class Q>
  __device__ static void qk(float (&sc)[BK / 8][4], Q& q, uint32_t sk, int) {
    fence_regs(sc);
    wgmma_fence();
    issue_s<HD, BK, PR>(sc, q, sk);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sc);
    fence_q(q);
  }

  // O += P V, waited for
  template <int HD, int BK, int PR = kTileKeys>
  __device__ static void pv_packed(float (&o)[HD / 8][4], uint32_t (&pa)[BK / 16][4], uint32_t sv) {
    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
    issue_pv<HD, BK, PR>(o, pa, sv);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
  }

  // the overlapped kernels' issue for key tile (or step) t: S = Q K^T from
  // the K tiles at sk, then O += P V with P of t - 1 and its V tiles at
  // sv_prev, as two asynchronous groups in that order (wgmma_wait<1> then
  // gives S)
  template <int HD, int BK, int PR = kTileKeys, class Q>
  __device__ static void issue_s_and_pv(float (&sc)[BK / 8][4], float (&o)[HD / 8][4], uint32_t (&pa)[BK / 16][4],
                                        Q& q, uint32_t sk, uint32_t sv_prev) {
    fence_regs(sc);
    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
    issue_s<HD, BK, PR>(sc, q, sk);
    wgmma_commit();
    issue_pv<HD, BK, PR>(o, pa, sv_prev);
    wgmma_commit();
  }

  template <int HD, int BK>
  __device__ static void pv(float (&o)[HD / 8][4], const float (&sc)[BK / 8][4], uint32_t sv, int) {
    uint32_t pa[BK / 16][4];
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
    pv_packed<HD, BK>(o, pa, sv);
  }
};

// FlashAttention-3's intra-warpgroup overlap: while the tensor cores compute
// S for key tile t and O += P V for tile t - 1, the warpgroup waits only for
// S, runs tile t's softmax on the CUDA cores, then waits for P V and rescales
// O. O is touched only after its MMA completes: rescaling afterwards is the
// same arithmetic, (O + P V) * corr. STAGES (3..5) stages of K/V: tile
// t + STAGES - 1 is loaded into the stage tile t - 1 used, once its P V has
// completed, so that STAGES - 1 tiles are in flight while one is computed.
// More stages hide more memory latency when an SM holds one CTA; fewer leave
// room for two (kernel_attrs.cuh measures it).
constexpr int kOverlapStages = 3;  // the template default; the plugin runs CudaBackend::kDefaultStages (3)

constexpr size_t overlap_smem(int32_t hd, int32_t bq, int32_t stages = kOverlapStages) {
  return WgMma::kAlign + static_cast<size_t>(2 * stages * kTileKeys + bq) * hd * 2;
}

// at head_dim 64 two 256-thread CTAs fit an SM if the registers allow (<= 128 each, no spills)
template <class Fmt, int HD, int BQ, int STAGES = kOverlapStages>
__global__ void __launch_bounds__(BQ * 2, (HD == 64 && BQ == 128) ? 2 : 1)
    attention_overlap_kernel(const AttentionArgs a, const typename Fmt::View kv) {
  static_assert(STAGES >= 3 && STAGES <= 5, "3 to 5 stages of K/V");
  constexpr int BK = kTileKeys, NT = BQ * 2;
  constexpr uint32_t kTileBytes = BK * HD * 2;
  static_assert(kTileBytes % WgMma::kAlign == 0, "every stage starts on a swizzle boundary");
  const uint32_t stages = (dynamic_smem_addr() + WgMma::kAlign - 1) & ~(WgMma::kAlign - 1);
  const uint32_t sq = stages + 2 * STAGES * kTileBytes;
  auto key_tile = [&](int t) { return stages + static_cast<uint32_t>(t % STAGES) * 2 * kTileBytes; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const ItemContext c = item_context(a, kv, BQ);
  const int n = c.w.tile_end - c.w.tile_begin;
  const bool pingpong = BQ == 128 && a.pingpong != 0;
  // t: the item's t-th key tile; one cp.async group per tile, possibly empty
  auto issue = [&](int t) {
    if (t < n)
      load_key_tile<Fmt, HD, NT, true>(a, kv, c, c.w.tile_begin + t, key_tile(t), key_tile(t) + kTileBytes, tid);
    cp_async_commit();
  };
  auto valid = [&](int t) { return tile_ref(c.s, c.cached, c.w.tile_begin + t).valid; };

  // prologue: Q with tile 0, then tiles 1 .. STAGES - 1; S and softmax of tile 0
  load_query_tile<HD, BQ, NT>(a, c, sq, tid);
#pragma unroll
  for (int t = 0; t < STAGES; ++t) issue(t);
  cp_async_wait<STAGES - 1>();
  fence_proxy_async_smem();
  __syncthreads();

  uint32_t qf[HD / 16][4];
  query_fragments<HD>(sq, warp, lane, qf);
  float o[HD / 8][4], m[2], l[2];  // output, running max of scaled logits (log2 units), this thread's sum
  start_rows<HD>(o, m, l);
  float corr[2];
  uint32_t pa[BK / 16][4];  // P of the tile before, as the A operand of P V
  if (n > 0) {
    float sc[BK / 8][4];
    WgMma::qk<HD, BK>(sc, qf, key_tile(0), lane);
    softmax_tile<BK>(sc, m, l, corr, valid(0), a.scale_log2, lane);  // O is still 0: nothing to rescale
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
  }

  for (int t = 1; t < n; ++t) {
    cp_async_wait<STAGES - 2>();  // tile t (the newer groups are tiles t + 1 .. t + STAGES - 2)
    fence_proxy_async_smem();
    __syncthreads();
    const uint32_t sk = key_tile(t), sv_prev = key_tile(t - 1) + kTileBytes;

    float sc[BK / 8][4];  // written by S's first k-step
    // ping-pong: the second warpgroup queues its MMAs behind the first's, so
    // that the first's softmax runs while the tensor cores work for the second
    if (pingpong && warp >= 4) named_barrier_sync(1, NT);
    WgMma::issue_s_and_pv<HD, BK>(sc, o, pa, qf, sk, sv_prev);
    if (pingpong && warp < 4) named_barrier_arrive(1, NT);

    wgmma_wait<1>();  // S of tile t; P V of tile t - 1 may still run
    fence_regs(sc);
    softmax_tile<BK>(sc, m, l, corr, valid(t), a.scale_log2, lane);

    wgmma_wait<0>();  // P V of tile t - 1
    fence_regs(o);
    fence_regs(pa);
    fence_regs(qf);
    rescale_rows<HD>(o, corr);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);

    __syncthreads();  // every warpgroup is done with tile t - 1's stage
    issue(t + STAGES - 1);
  }

  if (n > 0) WgMma::pv_packed<HD, BK>(o, pa, key_tile(n - 1) + kTileBytes);  // P V of the last tile
  // the cp.async groups committed past the last tile are empty: nothing is in flight here
  store_rows<HD, BQ>(a, c, warp, lane, o, m, l);
}

template <int STAGES = kOverlapStages, class Fmt = Fp16PageFormat>
struct OverlapAttention {
  using View = typename Fmt::View;
  template <int HD, int BQ>
  static constexpr auto kernel() {
    return attention_overlap_kernel<Fmt, HD, BQ, STAGES>;
  }
  static constexpr int threads(int bq) { return bq * 2; }
  static constexpr size_t smem(int32_t hd, int32_t bq) { return overlap_smem(hd, bq, STAGES); }
};

}  // namespace wm::cuda
