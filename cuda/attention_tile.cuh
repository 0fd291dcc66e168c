// The per-tile arithmetic both attention kernels share (attention.cu with
// mma.sync, attention_sm90.cu with wgmma): masking, the online softmax over
// one tile of scores held in the m16n8 accumulator layout, and the epilogue
// that writes a warp's 16 output rows (normalised, or as a split partial).
// Device code only.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention.cuh"
#include "cuda/device_util.cuh"
#include "cuda/kv_layout.h"
#include "cuda/mma.cuh"
#include "cuda/mma_layout.h"
#include "cuda/tile_load.cuh"

namespace wm::cuda {

// One CTA's share of a launch: work item blockIdx.x (a query tile of one
// session and a range of its key tiles) for head blockIdx.y.
struct ItemContext {
  WorkItem w;
  PlanSession s;
  int32_t cached = 0;     // the session's cached tokens at this layer
  int32_t q0 = 0, nq = 0;  // first query row (of the session's block) and rows in this tile
  int head = 0;
  int64_t head_rows = 0;  // row offset of this head in q16 / k16 / v16
  const int32_t* pt_row = nullptr;  // this (layer, head)'s page-table row
};

template <class View>
__device__ __forceinline__ ItemContext item_context(const AttentionArgs& a, const View& kv, int block_q) {
  ItemContext c;
  c.w = a.items[blockIdx.x];
  c.head = static_cast<int>(blockIdx.y);
  c.s = a.sessions[c.w.session];
  c.cached = a.cached[c.w.session];
  c.q0 = c.w.q_tile * block_q;
  c.nq = min(block_q, c.s.rows - c.q0);
  c.head_rows = static_cast<int64_t>(c.head) * a.rows_total;
  c.pt_row = kv.page_table + page_row_offset(c.s, a.layer, a.heads, c.head);
  return c;
}

// starts the copy of the item's query rows into the BQ x HD tile at sq (swz
// layout, or PANEL: the wgmma layout of a BQ-row panel tile, for Q read by
// descriptor), zero-filling rows past the session's block
template <int HD, int BQ, int NT, bool LEAN = false, bool PANEL = false>
__device__ __forceinline__ void load_query_tile(const AttentionArgs& a, const ItemContext& c, uint32_t sq, int tid) {
  load_rows_async<HD, BQ, NT, PANEL, LEAN>(sq, a.q16 + (c.head_rows + c.s.row0 + c.q0) * HD, c.nq, a.q16, tid);
}

// this warp's 16 query rows as m16n8k16 A fragments, one per 16 channels
template <int HD>
__device__ __forceinline__ void query_fragments(uint32_t sq, int warp, int lane, uint32_t (&qf)[HD / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    ldmatrix_x4(qf[kk], sq + swz<HD>(warp * 16 + a_row(lane), a_chunk(lane, kk)));
}

// starts the cp.async copies of the item's key tile `tile` into the K and V tiles at sk, sv: from the cache's
// pages, or from the session's own block (a.k16, a.v16). PANEL: wgmma layout,
// in panels of PROWS rows (load_rows_async: a format other than fp16 keeps
// the tile's own, kTileKeys); LEAN: load_rows_async's.
template <class Fmt, int HD, int NT, bool PANEL, bool LEAN = false, int PROWS = kTileKeys>
__device__ __forceinline__ void load_key_tile(const AttentionArgs& a, const typename Fmt::View& kv,
                                              const ItemContext& c, int tile, uint32_t sk, uint32_t sv, int tid) {
  const TileRef t = tile_ref(c.s, c.cached, tile);
  if (t.from_cache) {
    if constexpr (PROWS == kTileKeys)
      Fmt::template load_tile<HD, NT, PANEL, LEAN>(kv, c.pt_row, t.first, t.valid, sk, sv, tid);
    else
      Fmt::template load_tile<HD, NT, PANEL, LEAN, PROWS>(kv, c.pt_row, t.first, t.valid, sk, sv, tid);
  } else {
    const int64_t off = t.valid > 0 ? (c.head_rows + c.s.row0 + t.first) * HD : 0;
    load_rows_async<HD, kTileKeys, NT, PANEL, LEAN, PROWS>(sk, a.k16 + off, t.valid, a.k16, tid);
    load_rows_async<HD, kTileKeys, NT, PANEL, LEAN, PROWS>(sv, a.v16 + off, t.valid, a.v16, tid);
  }
}

// 2^x on the special-function unit, flushing subnormal results to 0: one
// instruction, where exp2f also scales subnormal inputs and outputs. The
// probabilities it makes are fp16 operands of P V, in which such values are
// 0 anyway. (The host build of the emulator uses exp2f.)
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// part[r][0] = the max of part[r][0 .. 2W - 1], for both rows r, in log2(2W)
// dependent steps (a max is the same in any order)
template <int W, int N>
__device__ __forceinline__ void max_tree(float (&part)[2][N]) {
  static_assert(N >= 2 * W && (W & (W - 1)) == 0, "halves down to one column");
  if constexpr (W >= 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < W; ++j) part[r][j] = fmaxf(part[r][j], part[r][j + W]);
    max_tree<W / 2>(part);
  }
}

// sc: this thread's scores for BK keys (sc[j][e]: row c_row(lane, e), key
// 8j + c_col(lane, e)); keys >= valid are masked. On return sc holds the
// unnormalised probabilities exp2(s * scale_log2 - m), m and l are updated
// and corr holds the factor that takes the output accumulated so far to the
// new running max. Rows g (r = 0) and g + 8 (r = 1); a row's 4 threads are
// one quad.
template <int BK>
__device__ __forceinline__ void softmax_tile(float (&sc)[BK / 8][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             int valid, float scale_log2, int lane) {
  if (valid < BK) {
#pragma unroll
    for (int j = 0; j < BK / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (8 * j + c_col(lane, e) >= valid) sc[j][e] = -INFINITY;
  }
  // each row's max over this thread's scores as a tree (log2(BK / 4) dependent
  // steps, not BK / 4: a row's max is the same in any order), both rows at once
  float part[2][BK / 8];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) part[r][j] = fmaxf(sc[j][2 * r], sc[j][2 * r + 1]);
  max_tree<BK / 16>(part);
#pragma unroll
  for (int r = 0; r < 2; ++r) part[r][0] = fmaxf(part[r][0], __shfl_xor_sync(0xffffffffu, part[r][0], 1));
#pragma unroll
  for (int r = 0; r < 2; ++r) part[r][0] = fmaxf(part[r][0], __shfl_xor_sync(0xffffffffu, part[r][0], 2));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mx = part[r][0];
    const float m_new = fmaxf(m[r], mx * scale_log2);
    // no key seen yet: subtract 0 so that exp2(-inf) gives 0, not nan
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    corr[r] = exp2_ftz(m[r] - m_use);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) {
      const float p0 = exp2_ftz(fmaf(sc[j][2 * r], scale_log2, -m_use));
      const float p1 = exp2_ftz(fmaf(sc[j][2 * r + 1], scale_log2, -m_use));
      sc[j][2 * r] = p0;
      sc[j][2 * r + 1] = p1;
      sum += p0 + p1;
    }
    l[r] = l[r] * corr[r] + sum;
    m[r] = m_new;
  }
}

// softmax_tile over BK / 64 key tiles (a step of the warp-specialised
// kernel), each with its own count of valid keys: a cache's last tile may be
// partial and still be followed by the block's own keys
template <int BK>
__device__ __forceinline__ void softmax_tiles(float (&sc)[BK / 8][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                              const int (&valid)[BK / kTileKeys], float scale_log2, int lane) {
  if constexpr (BK == kTileKeys) {
    softmax_tile<BK>(sc, m, l, corr, valid[0], scale_log2, lane);
  } else {
    constexpr int kJ = kTileKeys / 8;  // accumulator columns of 8 keys per tile
#pragma unroll
    for (int h = 0; h < BK / kTileKeys; ++h) {
      if (valid[h] >= kTileKeys) continue;
#pragma unroll
      for (int j = 0; j < kJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (8 * j + c_col(lane, e) >= valid[h]) sc[h * kJ + j][e] = -INFINITY;
    }
    softmax_tile<BK>(sc, m, l, corr, BK, scale_log2, lane);
  }
}

// the running state of a warp's rows before any key: O = 0, max = -inf, sum = 0
template <int HD>
__device__ __forceinline__ void start_rows(float (&o)[HD / 8][4], float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;
}

// o *= corr, row by row (softmax_tile's corr). Past the first tiles a row's
// running max rarely grows, so corr is exactly 1 for both of this thread's
// rows and the HD / 2 multiplies are skipped.
template <int HD>
__device__ __forceinline__ void rescale_rows(float (&o)[HD / 8][4], const float (&corr)[2]) {
  if (corr[0] == 1.0f && corr[1] == 1.0f) return;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
      o[j][2 * r] *= corr[r];
      o[j][2 * r + 1] *= corr[r];
    }
}

// softmax_tile, then the output rescaled to the new running max
template <int BK, int HD>
__device__ __forceinline__ void online_softmax_tile(float (&sc)[BK / 8][4], float (&o)[HD / 8][4], float (&m)[2],
                                                    float (&l)[2], int valid, float scale_log2, int lane) {
  float corr[2];
  softmax_tile<BK>(sc, m, l, corr, valid, scale_log2, lane);
  rescale_rows<HD>(o, corr);
}

// the A operand of P V for k-step kk: the probabilities of key tiles 2kk and
// 2kk + 1 repacked as fp16 pairs
template <int BK>
__device__ __forceinline__ void pack_p(const float (&sc)[BK / 8][4], int kk, uint32_t (&pa)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) pa[i] = pack_half2(sc[p_tile(kk, i)][p_elem(i)], sc[p_tile(kk, i)][p_elem(i) + 1]);
}

// writes this warp's 16 rows (warp * 16 + ...) of the item's query tile:
// the normalised output when the work item covers the whole cache, else the
// unnormalised partial with its running max and sum for attention_combine.cu
template <int HD, int BQ>
__device__ __forceinline__ void store_rows(const AttentionArgs& a, const ItemContext& c, int warp, int lane,
                                           const float (&o)[HD / 8][4], const float (&m)[2], float (&l)[2]) {
  const WorkItem& w = c.w;
  const int head = c.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + c_row(lane, 2 * r);
    if (row >= c.nq) continue;
    if (w.partial < 0) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const int64_t at = ((static_cast<int64_t>(c.s.row0) + c.q0 + row) * a.heads + head) * HD;
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        const float2 v = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
        *reinterpret_cast<float2*>(a.out + at + 8 * j + c_col(lane, 2 * r)) = v;
        if (a.out16 != nullptr)
          *reinterpret_cast<uint32_t*>(a.out16 + at + 8 * j + c_col(lane, 2 * r)) = pack_bf16x2(v.x, v.y);
      }
    } else {
      const int64_t prow = (static_cast<int64_t>(w.partial) * a.heads + head) * BQ + row;
      float* dst = a.partial_o + prow * HD;
#pragma unroll
      for (int j = 0; j < HD / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + c_col(lane, 2 * r)) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
      if ((lane & 3) == 0) *reinterpret_cast<float2*>(a.partial_ml + 2 * prow) = make_float2(m[r], l[r]);
    }
  }
}

}  // namespace wm::cuda
