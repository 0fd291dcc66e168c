// The KIVI-2 paged cache as a format type for the attention kernel (STYLE.md
// 5; kv_layout.h: KiviRowLayout): a key tile of the sink frames is copied
// from its fp16 unit like Fp16PageFormat's; a tile of the window is decoded
// from its 2-bit chunks into the same fp16 tiles (x = zero + code * scale,
// rounded to fp16), so the kernel's products see no difference: the
// mma.sync kernel and the Hopper kernels (attention_sm90.cuh) alike. Device
// code only.
#pragma once

#include <cuda_fp16.h>
#include <cstdint>

#include "cuda/kv_layout.h"
#include "cuda/mma.cuh"
#include "cuda/tile_load.cuh"

namespace wm::cuda {

namespace kivi {

// a block's fp16 scale and zero as floats
__device__ __forceinline__ void scale_zero(const uint8_t* block, float* s, float* z) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(block);
  *s = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  *z = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// 8 floats as 8 fp16 (round to nearest even), first in the lowest bits
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  return make_uint4(pack2(x[0], x[1]), pack2(x[2], x[3]), pack2(x[4], x[5]), pack2(x[6], x[7]));
}

}  // namespace kivi

// byte offset of 16-byte piece c of row r in a key or value tile: the wgmma
// panel layout (PANEL) or the mma.sync kernel's swizzle
template <int HD, bool PANEL>
__device__ __forceinline__ uint32_t tile_offset(int r, int c) {
  if constexpr (PANEL) {
    return panel_swz<HD, kTileKeys>(r, c);
  } else {
    return swz<HD>(r, c);
  }
}

struct KiviPageFormat {
  using View = PagedKvKiviView;

  // keys [first, first + kTileKeys) of one (layer, head), whose page-table
  // row is pt_row; rows past `valid` are zero. A tile lies in one unit
  // (kv_layout.h). PANEL: the tiles in the wgmma layout (mma_layout.h; the
  // stores are generic-proxy writes, which the kernels' fence.proxy.async
  // after each stage's copies covers as it covers cp.async); else swz.
  template <int HD, int NT, bool PANEL = false, bool LEAN = false>
  __device__ __forceinline__ static void load_tile(const View& kv, const int32_t* pt_row, int32_t first,
                                                   int32_t valid, uint32_t sk, uint32_t sv, int tid) {
    const KiviRowLayout& q = kv.row;
    const uint8_t* unit = kv.pool;
    if (valid > 0) {
      int32_t entry = 0, offset = 0;
      q.unit_at(first / q.unit_tokens, &entry, &offset);
      unit = kv.pool + static_cast<int64_t>(pt_row[entry]) * kv.page_bytes + offset;
    }
    const int32_t r0 = first % q.unit_tokens;  // the tile's first token inside its unit
    if (first < q.front_tokens()) {  // a sink frame's unit: fp16 rows, copied as they are
      const auto* kb = reinterpret_cast<const uint16_t*>(unit) + static_cast<int64_t>(r0) * HD;
      const uint16_t* vb = kb + static_cast<int64_t>(q.unit_tokens) * HD;
      const auto* safe = reinterpret_cast<const uint16_t*>(kv.pool);
      load_rows_async<HD, kTileKeys, NT, PANEL, LEAN>(sk, valid > 0 ? kb : safe, valid, safe, tid);
      load_rows_async<HD, kTileKeys, NT, PANEL, LEAN>(sv, valid > 0 ? vb : safe, valid, safe, tid);
      return;
    }
    constexpr int kUnits = HD / 8;  // 16-byte pieces of a row
    const int G = q.group, bb = q.block_bytes();
    // keys: a thread decodes channels 8c..8c+7 of kRows consecutive keys,
    // which share one code byte of each channel's block (a chunk is a
    // multiple of 4 keys, and so is the tile's start in its unit): 16 loads
    // for 16 kRows bytes. 2 rows: 4 held the overlapped kernel at head_dim
    // 64, block_q 128 past its 128 registers (spills)
    constexpr int kRows = 2;
    for (int i = tid; i < (kTileKeys / kRows) * kUnits; i += NT) {
      const int r = i / kUnits * kRows, c = i % kUnits;
      uint32_t w[kRows][4] = {};  // row r + j's 8 fp16 values, two to a word, as they are decoded
      if (r < valid) {
        const int u = r0 + r;  // token inside the unit
        const uint8_t* chunk = unit + (u / G) * q.chunk_bytes();
        const int byte = (u % G) >> 2, sh = (u & 3) * 2;
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // a channel pair: one word of each row
          const uint8_t* b0 = chunk + (c * 8 + e) * bb;
          const uint8_t* b1 = b0 + bb;
          float s0, z0, s1, z1;
          kivi::scale_zero(b0, &s0, &z0);
          kivi::scale_zero(b1, &s1, &z1);
          const uint32_t c0 = b0[4 + byte] >> sh, c1 = b1[4 + byte] >> sh;
#pragma unroll
          for (int j = 0; j < kRows; ++j)
            w[j][e / 2] = kivi::pack2(z0 + static_cast<float>((c0 >> (2 * j)) & 3u) * s0,
                                      z1 + static_cast<float>((c1 >> (2 * j)) & 3u) * s1);
        }
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const uint4 ko = r + j < valid ? make_uint4(w[j][0], w[j][1], w[j][2], w[j][3]) : make_uint4(0, 0, 0, 0);
        st_shared_16(sk + tile_offset<HD, PANEL>(r + j, c), ko);
      }
    }
    // values: a thread decodes channels 8c..8c+7 of one key, which lie in
    // one block (a group holds G >= 32 channels) as two whole code bytes
    for (int i = tid; i < kTileKeys * kUnits; i += NT) {
      const int r = i / kUnits, c = i % kUnits;
      uint4 vo = make_uint4(0, 0, 0, 0);
      if (r < valid) {
        const int u = r0 + r;
        const uint8_t* chunk = unit + (u / G) * q.chunk_bytes();
        const int t = u % G;  // inside its chunk
        const uint8_t* b = chunk + HD * bb + (t * (HD / G) + (c * 8) / G) * bb;
        float s, z;
        kivi::scale_zero(b, &s, &z);
        const int first_code = (c * 8) % G;
        const uint32_t codes = b[4 + first_code / 4] | (static_cast<uint32_t>(b[4 + first_code / 4 + 1]) << 8);
        float x[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = z + static_cast<float>((codes >> (2 * e)) & 3u) * s;
        vo = kivi::pack8(x);
      }
      st_shared_16(sv + tile_offset<HD, PANEL>(r, c), vo);
    }
  }
};

}  // namespace wm::cuda
