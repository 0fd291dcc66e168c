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
// TURN 1 + 3 STAGES + wg (16 per CTA: STAGES 3 or 4).
#pragma once

#include <cstdint>

#include "cuda/attention_sm90.cuh"

namespace wm::cuda {

// the producer's threads: a warp beside one consumer warpgroup, a warpgroup beside two
__host__ __device__ constexpr int ws_producer_threads(int bq) { return bq == 128 ? 128 : 32; }
__host__ __device__ constexpr int ws_threads(int bq) { return bq * 2 + ws_producer_threads(bq); }
// per-thread registers after the hand-over (two consumer warpgroups); a
// 384-thread CTA starts with 168 each (65536 / 384, in steps of 8)
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;
static_assert(128 * kWsProducerRegs + 256 * kWsConsumerRegs <= 384 * 168, "the hand-over fits the CTA's registers");

template <class Fmt, int HD, int BQ, int STAGES>
__global__ void __launch_bounds__(ws_threads(BQ), 1)
    attention_ws_kernel(const AttentionArgs a, const typename Fmt::View kv) {
  static_assert(STAGES == 3 || STAGES == 4, "the named barriers of 3 or 4 stages fit a CTA's 16");
  constexpr int BK = kTileKeys, NWG = BQ / 64, NC = BQ * 2, kProducer = ws_producer_threads(BQ);
  constexpr int kAhead = STAGES - 2;  // tiles landed and signalled behind the newest issued one
  constexpr int kFullThreads = kProducer + 128, kEmptyThreads = kProducer + NC, kTurnThreads = 256;
  constexpr uint32_t kTileBytes = BK * HD * 2;
  static_assert(kTileBytes % WgMma::kAlign == 0, "every stage starts on a swizzle boundary");
  const uint32_t stages = (dynamic_smem_addr() + WgMma::kAlign - 1) & ~(WgMma::kAlign - 1);
  const uint32_t sq = stages + 2 * STAGES * kTileBytes;
  auto key_tile = [&](int t) { return stages + static_cast<uint32_t>(t % STAGES) * 2 * kTileBytes; };
  auto full_id = [](int t, int wg) { return 1 + 2 * (t % STAGES) + wg; };
  auto empty_id = [](int t) { return 1 + 2 * STAGES + t % STAGES; };
  auto turn_id = [](int wg) { return 1 + 3 * STAGES + wg; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const ItemContext c = item_context(a, kv, BQ);
  const int n = c.w.tile_end - c.w.tile_begin;

  if (tid >= NC) {  // the producer
    if constexpr (NWG == 2) setmaxnreg_dec<kWsProducerRegs>();
    const int ptid = tid - NC;
    for (int t = 0; t < n + kAhead; ++t) {
      // first signal tile t - kAhead (groups 0 .. t - 1 are committed), then wait for a stage: so the
      // consumers' FULL for tile u hangs on their EMPTY for tile u - 3, a whole tile back
      if (t >= kAhead) {
        cp_async_wait<kAhead - 1>();  // tile t - kAhead has landed
        fence_proxy_async_smem();
#pragma unroll
        for (int wg = 0; wg < NWG; ++wg) named_barrier_arrive(full_id(t - kAhead, wg), kFullThreads);
      }
      if (t < n) {
        if (t >= STAGES) named_barrier_sync(empty_id(t), kEmptyThreads);
        if (t == 0) load_query_tile<HD, BQ, kProducer, true>(a, c, sq, ptid);
        load_key_tile<Fmt, HD, kProducer, true, true>(a, kv, c, c.w.tile_begin + t, key_tile(t),
                                                      key_tile(t) + kTileBytes, ptid);
      }
      cp_async_commit();  // possibly empty: the group count stays one per t
    }
    return;
  }

  if constexpr (NWG == 2) setmaxnreg_inc<kWsConsumerRegs>();
  const int wg = warp >> 2;
  const bool pingpong = NWG == 2 && a.pingpong != 0;
  uint32_t qf[HD / 16][4];
  float o[HD / 8][4], m[2], l[2];  // output, running max of scaled logits (log2 units), this thread's sum
  start_rows<HD>(o, m, l);
  float corr[2];
  uint32_t pa[BK / 16][4];  // P of the tile before, as the A operand of P V
  if (n > 0) {
    named_barrier_sync(full_id(0, wg), kFullThreads);  // Q and tile 0
    query_fragments<HD>(sq, warp, lane, qf);
    float sc[BK / 8][4];
    WgMma::qk<HD, BK>(sc, qf, key_tile(0), lane);
    softmax_tile<BK>(sc, m, l, corr, tile_ref(c.s, c.cached, c.w.tile_begin).valid, a.scale_log2, lane);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
    if (pingpong && wg == 1 && n >= 2) named_barrier_arrive(turn_id(0), kTurnThreads);  // the first goes first
  }

  for (int t = 1; t < n; ++t) {
    named_barrier_sync(full_id(t, wg), kFullThreads);
    const uint32_t sk = key_tile(t), sv_prev = key_tile(t - 1) + kTileBytes;
    float sc[BK / 8][4];
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    if (pingpong) named_barrier_sync(turn_id(wg), kTurnThreads);
    WgMma::issue_s_and_pv<HD, BK>(sc, o, pa, qf, sk, sv_prev);
    // the other warpgroup's turn (the second's last arrival would have nobody to meet)
    if (pingpong && !(wg == 1 && t == n - 1)) named_barrier_arrive(turn_id(1 - wg), kTurnThreads);

    wgmma_wait<1>();  // S of tile t; P V of tile t - 1 may still run
    fence_regs(sc);
    softmax_tile<BK>(sc, m, l, corr, tile_ref(c.s, c.cached, c.w.tile_begin + t).valid, a.scale_log2, lane);

    wgmma_wait<0>();  // P V of tile t - 1: its stage is free
    fence_regs(o);
    fence_regs(pa);
    fence_regs(qf);
    if (t - 1 + STAGES < n) named_barrier_arrive(empty_id(t - 1), kEmptyThreads);
    rescale_rows<HD>(o, corr);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
  }

  if (n > 0) WgMma::pv_packed<HD, BK>(o, pa, key_tile(n - 1) + kTileBytes);  // P V of the last tile
  store_rows<HD, BQ>(a, c, warp, lane, o, m, l);
}

template <int STAGES>
struct WsAttention {
  template <int HD, int BQ>
  static constexpr auto kernel() {
    return attention_ws_kernel<Fp16PageFormat, HD, BQ, STAGES>;
  }
  static constexpr int threads(int bq) { return ws_threads(bq); }
  static constexpr size_t smem(int32_t hd, int32_t bq) { return overlap_smem(hd, bq, STAGES); }
};

}  // namespace wm::cuda
