// The warp-specialised Hopper attention kernel (sm_90a only): the
// overlapped kernel's arithmetic (attention_sm90.cuh) with the loads moved
// to a producer and the per-tile __syncthreads replaced by named
// barriers, so that the consumer warpgroups run out of phase with each
// other and with the loads (FlashAttention-3's warp specialisation, with
// cp.async in place of TMA). BQ / 64 consumer warpgroups (threads
// [0, 2 BQ)) and the producer: the last 32 threads (one warp) beside one
// consumer warpgroup, the last 128 (a warpgroup) beside two. Two consumer
// warpgroups need more registers than the 168 a thread of a 384-thread CTA
// starts with: the producer warpgroup gives most of its own back
// (setmaxnreg.dec to 40) and the consumers take them (setmaxnreg.inc to
// 232), 128 x 40 + 256 x 232 = 384 x 168:
//
//   producer   step t: arrive FULL(stage, wg) for tile t - (STAGES - 2) for
//              each warpgroup, once its copies have landed and are fenced
//              for wgmma; then wait EMPTY(stage) until both warpgroups are
//              done with the tile that held stage t % STAGES (t - STAGES)
//              and cp.async tile t (Q with tile 0)
//   consumer   for tile t: sync FULL(stage of t, wg); [ping-pong: sync
//              TURN(wg)] issue S(t) and P V(t - 1); [arrive TURN(other)];
//              softmax(t); wait P V(t - 1); rescale; arrive EMPTY(stage of
//              t - 1) if the producer will refill it
//
// A barrier phase can never be overrun: the producer arrives FULL for tile
// t + STAGES only after EMPTY for a tile past t, which the consumers arrive
// at after their FULL for tile t; TURN keeps the two warpgroups within one
// tile of each other. Barrier ids: FULL 1 + 2 s + wg, EMPTY 1 + 2 STAGES + s,
// TURN 1 + 3 STAGES + wg (16 per CTA: STAGES 3 or 4); the TMA build has no
// FULL named barriers: EMPTY 1 + s, TURN 1 + STAGES + wg, so that it also
// runs 5 and 6 stages (6 steps of 64 keys and the query tile: 224 KiB at
// head_dim 128).
//
// TMA (the kernel's last template parameter): the producer's first thread
// copies every whole key tile, of the cache (kv.tensor_map) and of the
// block's own keys (AttentionArgs::block_map), with the tensor memory
// accelerator (cuda/tma.cuh): one instruction per 64 channels of a tile's K
// and of its V (4 a tile at head_dim 128, where the 128 producer threads
// issued 16 cp.async each, with their addresses), and FULL becomes
// one mbarrier per stage that both warpgroups wait on by phase parity. Its
// phase for step t completes when the first thread has announced the step's
// tensor bytes (arrive.expect_tx, as it issues them), those bytes have
// landed, and every producer thread has arrived once its own cp.async of
// the step (Q, partial tiles, zeros) landed and was fenced: kProducer + 1
// arrivals. A partial tile stays on cp.async because its rows past the
// valid ones must be zeros (0 x V must not be NaN: a page's unwritten rows
// may hold anything), which a tensor copy gives only at the tensor's edge.
//
// Ablations (AttentionArgs::ws_ablate, benchmarks only: the outputs are
// wrong): kWsLoadsOnly keeps the producer and every FULL wait, while the
// consumers release each step as it lands and compute nothing, so the
// launch takes what the loads alone take; kWsComputeOnly keeps the
// consumers and every barrier, while the producer loads the first STAGES
// steps only, so the launch takes what the consumers alone take. A kernel
// near the larger of the two overlaps them; one near their sum does not.
#pragma once

#include <cstdint>

#include "cuda/attention_sm90.cuh"
#include "cuda/tma.cuh"

namespace wm::cuda {

// the producer's threads: a warp beside one consumer warpgroup, a warpgroup beside two
__host__ __device__ constexpr int ws_producer_threads(int bq) { return bq == 128 ? 128 : 32; }
__host__ __device__ constexpr int ws_threads(int bq) { return bq * 2 + ws_producer_threads(bq); }
// per-thread registers after the hand-over (two consumer warpgroups); a
// 384-thread CTA starts with 168 each (65536 / 384, in steps of 8)
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 384 * 168, "the hand-over fits the CTA's registers");

// the K/V ring's shared memory: STAGES steps of TPS key tiles, then the
// query tile, then (TMA) the stages' FULL mbarriers
constexpr size_t ws_smem(int32_t hd, int32_t bq, int32_t stages, int32_t tps, bool tma = false) {
  return WgMma::kAlign + static_cast<size_t>(2 * stages * tps * kTileKeys + bq) * hd * 2 +
         (tma ? 8 * static_cast<size_t>(stages) : 0);
}

// a if A, else b (of another type)
template <bool A, class X, class Y>
__device__ __forceinline__ auto& either(X& a, Y& b) {
  if constexpr (A) {
    return a;
  } else {
    return b;
  }
}

// TPS: key tiles per step, 1 (64 keys) or 2 (128: half the barriers, waits
// and row reductions per key; the S accumulators and P double). A step's K
// (and its V) are one panel tile of BK rows (mma_layout.h: panel_swz<HD, BK>;
// the second 64-key tile's rows start 64 x 128 bytes in), so that S is one
// m64n128k16 per 16 channels at 128 keys rather than two m64n64k16, with
// Q from shared memory (the query tile in the same panel layout) so that
// the doubled scores have the registers Q's fragments took.
template <class Fmt, int HD, int BQ, int STAGES, int TPS, bool TMA = false>
__global__ void __launch_bounds__(ws_threads(BQ), 1)
    attention_ws_kernel(const AttentionArgs a, const typename Fmt::View kv) {
  static_assert(STAGES == 3 || STAGES == 4 || (TMA && STAGES <= 6),
                "the named barriers of 3 or 4 stages fit a CTA's 16 (of up to 6 without FULL's: TMA)");
  static_assert(TPS == 1 || TPS == 2, "64 or 128 keys per step");
  constexpr int BK = kTileKeys * TPS, NWG = BQ / 64, NC = BQ * 2, kProducer = ws_producer_threads(BQ);
  // 128 keys a step read Q from shared memory by descriptor (both operands of S), which frees the 32
  // registers a thread's query fragments take at head_dim 128 for the step's doubled scores
  constexpr bool kQSmem = TPS == 2;
  constexpr int kAhead = STAGES - 2;  // steps landed and signalled behind the newest issued one
  constexpr int kFullThreads = kProducer + 128, kEmptyThreads = kProducer + NC, kTurnThreads = 256;
  // a stage: the step's K as one BK-row panel tile, then its V likewise;
  // key tile h of a step is rows 64 h .. 64 h + 63 of them
  constexpr uint32_t kSideBytes = BK * HD * 2, kStepBytes = 2 * kSideBytes, kHalfBytes = kTileKeys * 128;
  static_assert(kSideBytes % WgMma::kAlign == 0, "every panel tile starts on a swizzle boundary");
  const uint32_t stages = (dynamic_smem_addr() + WgMma::kAlign - 1) & ~(WgMma::kAlign - 1);
  const uint32_t sq = stages + STAGES * kStepBytes;
  auto key_tile = [&](int t, int h) {
    return stages + static_cast<uint32_t>(t % STAGES) * kStepBytes + static_cast<uint32_t>(h) * kHalfBytes;
  };
  auto value_tile = [&](int t, int h) { return key_tile(t, h) + kSideBytes; };
  auto full_id = [](int t, int wg) { return 1 + 2 * (t % STAGES) + wg; };
  constexpr int kEmptyBase = TMA ? 1 : 1 + 2 * STAGES;  // FULL's named barriers come first, where they exist
  static_assert(kEmptyBase + STAGES + 2 <= 16, "a CTA has 16 named barriers");
  auto empty_id = [](int t) { return kEmptyBase + t % STAGES; };
  auto turn_id = [](int wg) { return kEmptyBase + STAGES + wg; };
  const uint32_t full_bars = sq + BQ * HD * 2;  // TMA: FULL of stage s at full_bars + 8 s
  auto full_bar = [&](int t) { return full_bars + 8 * static_cast<uint32_t>(t % STAGES); };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const ItemContext c = item_context(a, kv, BQ);
  const int n = c.w.tile_end - c.w.tile_begin;  // key tiles
  const int ns = (n + TPS - 1) / TPS;             // steps

  // TMA: key tile i (of the item) is copied by tensor copies: a whole tile, of the cache or of the block's own
  // keys, where its tensor map is set
  auto by_tma = [&](int i) {
    if constexpr (!TMA) {
      return false;
    } else {
      if (i >= n) return false;
      const TileRef r = tile_ref(c.s, c.cached, c.w.tile_begin + i);
      return r.valid == kTileKeys && (r.from_cache ? kv.tensor_map : a.block_map) != nullptr;
    }
  };
  if constexpr (TMA) {
    if (tid == 0) {
      for (int s = 0; s < STAGES; ++s) mbarrier_init(full_bar(s), kProducer + 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }

  if (tid >= NC) {  // the producer
    if constexpr (NWG == 2) setmaxnreg_dec<kWsProducerRegs>();
    const int ptid = tid - NC;
    if constexpr (TMA) {
      if (ptid == 0) {
        if (kv.tensor_map != nullptr) tensormap_acquire(kv.tensor_map);
        if (a.block_map != nullptr) tensormap_acquire(a.block_map);
      }
    }
    for (int t = 0; t < ns + kAhead; ++t) {
      // kWsComputeOnly: past the ring's first round no step is loaded (its stage keeps the tiles of the step
      // STAGES back), while every barrier still runs
      const bool load = !(a.ws_ablate == kWsComputeOnly && t >= STAGES);
      // first signal step t - kAhead (groups 0 .. t - 1 are committed), then wait for a stage: so the
      // consumers' FULL for step u hangs on their EMPTY for step u - 3, a whole step back
      if (t >= kAhead) {
        cp_async_wait<kAhead - 1>();  // step t - kAhead has landed
        fence_proxy_async_smem();
        if constexpr (TMA) {
          mbarrier_arrive(full_bar(t - kAhead));
        } else {
#pragma unroll
          for (int wg = 0; wg < NWG; ++wg) named_barrier_arrive(full_id(t - kAhead, wg), kFullThreads);
        }
      }
      if (t < ns) {
        if (t >= STAGES) named_barrier_sync(empty_id(t), kEmptyThreads);
        if (t == 0) load_query_tile<HD, BQ, kProducer, true, kQSmem>(a, c, sq, ptid);
        bool tma[TPS];  // which of the step's tiles come by tensor copies
#pragma unroll
        for (int h = 0; h < TPS; ++h) tma[h] = load && by_tma(TPS * t + h);
        if constexpr (TMA) {
          if (ptid == 0) {
            uint32_t bytes = 0;
#pragma unroll
            for (int h = 0; h < TPS; ++h) bytes += tma[h] ? 2 * kTileKeys * HD * 2 : 0;
            mbarrier_arrive_expect_tx(full_bar(t), bytes);
#pragma unroll
            for (int h = 0; h < TPS; ++h) {
              if (!tma[h]) continue;
              const TileRef r = tile_ref(c.s, c.cached, c.w.tile_begin + TPS * t + h);
              // the cache: K at row `row` of page `page`, V page_tokens rows on; the block: rows of k16, v16
              const void* map = kv.tensor_map;
              int32_t k_row = 0, v_row = 0, page = 0;
              if (r.from_cache) {
                page = c.pt_row[r.first / kv.page_tokens];
                k_row = r.first % kv.page_tokens;
                v_row = kv.page_tokens + k_row;
              } else {
                map = a.block_map;
                const int64_t row = c.head_rows + c.s.row0 + r.first;
                k_row = static_cast<int32_t>(a.k_map_row + row);
                v_row = static_cast<int32_t>(a.v_map_row + row);
              }
              // panel p (channels 64 p .. 64 p + 63) of the step's BK-row panel tile, BK rows of 128 bytes
#pragma unroll
              for (int p = 0; p < HD / 64; ++p) {
                const uint32_t panel = static_cast<uint32_t>(p) * BK * 128;
                tma_load_3d(key_tile(t, h) + panel, map, 64 * p, k_row, page, full_bar(t));
                tma_load_3d(value_tile(t, h) + panel, map, 64 * p, v_row, page, full_bar(t));
              }
            }
          }
        }
#pragma unroll
        for (int h = 0; h < TPS; ++h) {
          if (tma[h] || !load) continue;
          if (TPS * t + h < n) {
            load_key_tile<Fmt, HD, kProducer, true, true, BK>(a, kv, c, c.w.tile_begin + TPS * t + h, key_tile(t, h),
                                                              value_tile(t, h), ptid);
          } else {  // past the item's last tile: zeros, whose scores are masked (0 x V must not be NaN)
            load_rows_async<HD, kTileKeys, kProducer, true, true, BK>(key_tile(t, h), a.k16, 0, a.k16, ptid);
            load_rows_async<HD, kTileKeys, kProducer, true, true, BK>(value_tile(t, h), a.v16, 0, a.v16, ptid);
          }
        }
      }
      cp_async_commit();  // possibly empty: the group count stays one per t
    }
    return;
  }

  if constexpr (NWG == 2) setmaxnreg_inc<kWsConsumerRegs>();
  const int wg = warp >> 2;
  const bool pingpong = NWG == 2 && a.pingpong != 0;
  uint32_t qf[HD / 16][4];  // Q's fragments, where Q is read from registers
  QTile<BQ> qs{sq + static_cast<uint32_t>(wg) * 64 * 128};  // this warpgroup's rows of the Q tile
  auto& q = either<kQSmem>(qs, qf);  // the A operand of S
  float o[HD / 8][4], m[2], l[2];  // output, running max of scaled logits (log2 units), this thread's sum
  start_rows<HD>(o, m, l);
  float corr[2];
  int valid[TPS];  // keys of each of the step's tiles (0 past the item's last)
  auto step_valid = [&](int t) {
#pragma unroll
    for (int h = 0; h < TPS; ++h)
      valid[h] = TPS * t + h < n ? tile_ref(c.s, c.cached, c.w.tile_begin + TPS * t + h).valid : 0;
  };
  // step t's K and V (and Q with step 0) have landed
  auto wait_full = [&](int t) {
    if constexpr (TMA) {
      mbarrier_wait(full_bar(t), static_cast<uint32_t>(t / STAGES) & 1u);
    } else {
      named_barrier_sync(full_id(t, wg), kFullThreads);
    }
  };
  if (a.ws_ablate == kWsLoadsOnly) {  // each step released as soon as it has landed: O stays 0
    for (int t = 0; t < ns; ++t) {
      wait_full(t);
      if (t + STAGES < ns) named_barrier_arrive(empty_id(t), kEmptyThreads);
    }
    store_rows<HD, BQ>(a, c, warp, lane, o, m, l);
    return;
  }
  uint32_t pa[BK / 16][4];  // P of the step before, as the A operand of P V
  if (ns > 0) {
    wait_full(0);  // Q and step 0
    if constexpr (!kQSmem) query_fragments<HD>(sq, warp, lane, qf);
    float sc[BK / 8][4];
    WgMma::qk<HD, BK, BK>(sc, q, key_tile(0, 0), lane);
    step_valid(0);
    softmax_tiles<BK>(sc, m, l, corr, valid, a.scale_log2, lane);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
    if (pingpong && wg == 1 && ns >= 2) named_barrier_arrive(turn_id(0), kTurnThreads);  // the first goes first
  }

  for (int t = 1; t < ns; ++t) {
    wait_full(t);
    float sc[BK / 8][4];  // written by S's first k-step
    if (pingpong) named_barrier_sync(turn_id(wg), kTurnThreads);
    WgMma::issue_s_and_pv<HD, BK, BK>(sc, o, pa, q, key_tile(t, 0), value_tile(t - 1, 0));
    // the other warpgroup's turn (the second's last arrival would have nobody to meet)
    if (pingpong && !(wg == 1 && t == ns - 1)) named_barrier_arrive(turn_id(1 - wg), kTurnThreads);

    step_valid(t);
    wgmma_wait<1>();  // S of step t; P V of step t - 1 may still run
    fence_regs(sc);
    softmax_tiles<BK>(sc, m, l, corr, valid, a.scale_log2, lane);

    wgmma_wait<0>();  // P V of step t - 1: its stage is free
    fence_regs(o);
    fence_regs(pa);
    fence_q(q);
    if (t - 1 + STAGES < ns) named_barrier_arrive(empty_id(t - 1), kEmptyThreads);
    rescale_rows<HD>(o, corr);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
  }

  if (ns > 0) WgMma::pv_packed<HD, BK, BK>(o, pa, value_tile(ns - 1, 0));  // P V of the last step
  store_rows<HD, BQ>(a, c, warp, lane, o, m, l);
}

template <int STAGES, int TPS = 1, bool TMA = false>
struct WsAttention {
  using View = PagedKvFp16View;
  template <int HD, int BQ>
  static constexpr auto kernel() {
    return attention_ws_kernel<Fp16PageFormat, HD, BQ, STAGES, TPS, TMA>;
  }
  static constexpr int threads(int bq) { return ws_threads(bq); }
  static constexpr size_t smem(int32_t hd, int32_t bq) { return ws_smem(hd, bq, STAGES, TPS, TMA); }
};

}  // namespace wm::cuda
