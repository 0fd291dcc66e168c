// The QVG-2 / QuantWM-2 paged cache as a format type for the attention
// kernel (STYLE.md 5; kv_layout.h: SpanRowLayout): a key tile of the sink
// frames is copied from its fp16 unit; a tile of the window is decoded
// token by token into the same fp16 tiles, as the CPU's reference decoder
// does (quant/span_codec.cc): x = level(code) * scale + centroid[id], and
// for QuantWM-2 keys + sum_r alpha_r basis_r (PSAC folded into the keys),
// then rounded to fp16. Device code only.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>
#include <cstring>

#include "cuda/kv_format_kivi.cuh"
#include "cuda/kv_layout.h"
#include "cuda/mma.cuh"
#include "cuda/tile_load.cuh"

namespace wm::cuda {

namespace span {

__device__ __forceinline__ float float_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

// OCP fp8 e4m3 (quant/fp8_e4m3.h), the magnitude of a residual scale
__device__ __forceinline__ float e4m3(uint32_t c) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 0x7u;
  if (e == 0) return static_cast<float>(m) * (1.0f / 512.0f);
  if (e == 15 && m == 7) return float_bits(0x7fc00000u);
  return float_bits(((e + 120u) << 23) | (m << 20));
}

__device__ __forceinline__ float half_at(const uint8_t* p, int i) {
  return __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(p)[i]));
}

// channels 8c..8c+7 of one token: its residual (records `rec`, block B)
// plus its centroid row `cen` (fp16), into x
template <int HD>
__device__ __forceinline__ void decode8(const uint8_t* rec, int B, const uint8_t* cen, int c, float (&x)[8]) {
  const int ch = c * 8, b = ch / B;
  const uint8_t* blk = rec + b * (1 + B / 4);
  const uint32_t sb = blk[0];
  const float s = e4m3(sb & 0x7fu), off = (sb & 0x80u) ? 1.0f : 1.5f;
  const int first = ch % B;  // a multiple of 8: two whole code bytes
  const uint32_t codes = blk[1 + first / 4] | (static_cast<uint32_t>(blk[2 + first / 4]) << 8);
  const uint4 cw = *reinterpret_cast<const uint4*>(cen + ch * 2);
  const uint32_t cv[4] = {cw.x, cw.y, cw.z, cw.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float level = (static_cast<float>((codes >> (2 * e)) & 3u) - off) * s;
    const unsigned short h = static_cast<unsigned short>((cv[e / 2] >> (16 * (e & 1))) & 0xffffu);
    x[e] = level + __half2float(__ushort_as_half(h));
  }
}

}  // namespace span

struct SpanPageFormat {
  using View = PagedKvSpanView;

  // keys [first, first + kTileKeys) of one (layer, head), whose page-table
  // row is pt_row; rows past `valid` are zero. A tile lies in one unit.
  // PANEL: the tiles in the wgmma layout (the stores are generic-proxy
  // writes, as KiviPageFormat's); else swz.
  template <int HD, int NT, bool PANEL = false, bool LEAN = false>
  __device__ __forceinline__ static void load_tile(const View& kv, const int32_t* pt_row, int32_t first,
                                                   int32_t valid, uint32_t sk, uint32_t sv, int tid) {
    const SpanRowLayout& L = kv.row;
    if (first < L.front_tokens) {  // a sink frame's unit: fp16 rows, copied as they are
      const auto* safe = reinterpret_cast<const uint16_t*>(kv.pool);
      const uint16_t* kb = safe;
      const uint16_t* vb = safe;
      if (valid > 0) {
        int32_t entry = 0, offset = 0;
        L.front.at(first / kTileKeys, &entry, &offset);
        kb = reinterpret_cast<const uint16_t*>(kv.pool + static_cast<int64_t>(pt_row[entry]) * kv.page_bytes + offset);
        vb = kb + kTileKeys * HD;
      }
      load_rows_async<HD, kTileKeys, NT, PANEL, LEAN>(sk, kb, valid, safe, tid);
      load_rows_async<HD, kTileKeys, NT, PANEL, LEAN>(sv, vb, valid, safe, tid);
      return;
    }
    const uint8_t* unit = kv.pool;
    if (valid > 0) {
      int32_t entry = 0, offset = 0;
      L.units.at((first - L.front_tokens) / kTileKeys, &entry, &offset);
      unit = kv.pool + static_cast<int64_t>(pt_row[entry]) * kv.page_bytes + offset;
    }
    const int32_t* map = nullptr;  // each window slot's table
    {
      int32_t entry = 0, offset = 0;
      L.map.at(0, &entry, &offset);
      map = reinterpret_cast<const int32_t*>(kv.pool + (valid > 0 ? static_cast<int64_t>(pt_row[entry]) * kv.page_bytes + offset : 0));
    }
    constexpr int kPieces = HD / 8;  // 16-byte pieces of a row
    const int B = L.block, rb = L.rec_bytes;
    for (int i = tid; i < kTileKeys * kPieces; i += NT) {
      const int r = i / kPieces, c = i % kPieces;
      uint4 ko = make_uint4(0, 0, 0, 0), vo = ko;
      if (r < valid) {
        int32_t entry = 0, offset = 0;
        L.tables.at(map[L.slot_of(first + r)], &entry, &offset);
        const uint8_t* table = kv.pool + static_cast<int64_t>(pt_row[entry]) * kv.page_bytes + offset;
        float x[8];
        span::decode8<HD>(unit + r * rb, B, table + unit[L.k_ids() + r] * (2 * HD), c, x);
        if (L.coeff_bytes > 0) {  // PSAC: + sum_r alpha_r basis_r
          const uint8_t* rec = unit + L.k_coeffs() + r * L.coeff_bytes;
          const float s = span::half_at(rec, 0);
          const uint8_t* basis = table + L.basis_table() + c * 16;
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            int code;
            if (L.coeff_bytes == 10) {
              code = static_cast<int8_t>(rec[2 + q]);
            } else {
              const int nib = (rec[2 + q / 2] >> ((q & 1) * 4)) & 0xf;
              code = nib >= 8 ? nib - 16 : nib;
            }
            const float alpha = static_cast<float>(code) * s;
            const uint8_t* u = basis + q * (2 * HD);
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] += alpha * span::half_at(u, e);
          }
        }
        ko = kivi::pack8(x);
        span::decode8<HD>(unit + L.v_recs() + r * rb, B, table + L.v_table() + unit[L.v_ids() + r] * (2 * HD), c, x);
        vo = kivi::pack8(x);
      }
      st_shared_16(sk + tile_offset<HD, PANEL>(r, c), ko);
      st_shared_16(sv + tile_offset<HD, PANEL>(r, c), vo);
    }
  }
};

}  // namespace wm::cuda
