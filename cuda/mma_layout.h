// Where each lane of a warp points ldmatrix, and which accumulator element it
// holds, in the attention kernel's tensor-core tiles (attention.cu). Plain
// index math, compiled for host and device: cuda_host_test.cc runs it through
// a CPU model of ldmatrix and mma.m16n8k16 built from the PTX ISA fragment
// tables, so a wrong lane mapping fails a test without a GPU.
//
// Tiles in shared memory are [rows][HD] fp16, 16-byte chunks XOR-swizzled
// per row so that the 8 rows one ldmatrix phase reads fall in distinct banks.
#pragma once

#include <cstdint>

#include "cuda/kv_layout.h"

namespace wm::cuda {

// byte offset of 16-byte chunk c (of HD / 8) of row r
template <int HD>
WM_HD_INLINE uint32_t swz(int r, int c) {
  constexpr int kChunks = HD / 8;
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16, "head_dim 32, 64 or 128");
  const int cs = kChunks >= 8 ? (c ^ (r & 7)) : (c ^ ((r >> 1) & 3));
  return static_cast<uint32_t>((r * kChunks + cs) * 16);
}

// A operand (Q, 16 rows of warp w): ldmatrix.x4 of rows 16w + a_row, chunk a_chunk
WM_HD_INLINE int a_row(int lane) { return lane & 15; }
WM_HD_INLINE int a_chunk(int lane, int kk) { return 2 * kk + (lane >> 4); }

// B operand from K [keys][HD] (non-transposed ldmatrix.x4): key tiles 2jj, 2jj+1, channels 16kk..16kk+15
WM_HD_INLINE int kb_row(int lane, int jj) { return 16 * jj + (lane & 7) + ((lane >> 4) << 3); }
WM_HD_INLINE int kb_chunk(int lane, int kk) { return 2 * kk + ((lane >> 3) & 1); }

// B operand from V [keys][HD] (ldmatrix.x4.trans): keys 16kk..16kk+15, channel tiles 2jj, 2jj+1
WM_HD_INLINE int vb_row(int lane, int kk) { return 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3); }
WM_HD_INLINE int vb_chunk(int lane, int jj) { return 2 * jj + (lane >> 4); }

// accumulator element e (0..3) of a lane in a 16x8 tile
WM_HD_INLINE int c_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
WM_HD_INLINE int c_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// the S accumulators become the A operand of P V: A register i of k-step kk
// packs elements p_elem(i), p_elem(i) + 1 of key tile p_tile(kk, i)
WM_HD_INLINE int p_tile(int kk, int i) { return 2 * kk + (i >> 1); }
WM_HD_INLINE int p_elem(int i) { return 2 * (i & 1); }


// ---- Hopper warpgroup MMA (attention_sm90.cu) ----
//
// wgmma reads its B operand straight from shared memory through a 64-bit
// descriptor, so the key and value tiles must be in one of the layouts the
// PTX ISA calls canonical ("Shared Memory Matrix Layout"). We use the 128-byte
// swizzle for both: a [rows][HD] fp16 tile is stored as HD / 64 "panels" of
// [rows][64], each row of a panel 128 bytes, and inside every 1024-byte group
// of 8 rows the 16-byte chunk c of row r sits at chunk c ^ (r % 8). The
// hardware applies that XOR to address bits 4-6 from bits 7-9, so every panel
// must start on a 1024-byte boundary. For HD == 64 this is exactly swz<64>.
//
// Keys: S = Q K^T takes B = K^T (k = head channel, n = key), stored with k
// contiguous per key: "K-major", one k-step of 16 channels = 32 bytes of a
// row. Values: O = P V takes B = V (k = key, n = channel), stored with n
// contiguous: "MN-major", which the instruction reads with imm-trans-b = 1.

// byte offset of 16-byte chunk c (of HD / 8) of row r in a ROWS x HD panel tile
template <int HD, int ROWS>
WM_HD_INLINE uint32_t panel_swz(int r, int c) {
  static_assert(HD == 64 || HD == 128, "panels of 64 channels");
  static_assert(ROWS % 8 == 0, "whole 1024-byte swizzle groups");
  return static_cast<uint32_t>((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// the matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start
// address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-
// dimension byte offset >> 4, 49-51 base offset (0: patterns start on 1024-
// byte boundaries), 62-63 swizzle mode (1 = 128-byte)
WM_HD_INLINE uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// B of S = Q K^T for k-step kk (channels 16kk..16kk+15) and all BK keys of
// the tile at `tile` (1024-aligned). K-major, 128B swizzle: LBO unused (1),
// SBO = 1024 (from one 8-key group to the next); the k-step moves the start
// to panel kk / 4, 32 bytes per step inside the 128-byte row.
template <int HD, int ROWS>
WM_HD_INLINE uint64_t key_desc(uint32_t tile, int kk) {  // kk < HD / 16
  static_assert((HD == 64 || HD == 128) && ROWS % 8 == 0, "panels of 64 channels, whole swizzle groups");
  return wgmma_desc(tile + static_cast<uint32_t>((kk >> 2) * ROWS * 128 + (kk & 3) * 32), 16, 1024);
}

// B of O = P V for k-step kk (keys 16kk..16kk+15) and all HD channels.
// MN-major, 128B swizzle: LBO = one panel (from channels 0-63 to 64-127),
// SBO = 1024 (from one 8-key group to the next); the k-step moves the start
// by 16 rows of 128 bytes.
template <int HD, int ROWS>
WM_HD_INLINE uint64_t value_desc(uint32_t tile, int kk) {  // kk < ROWS / 16
  static_assert((HD == 64 || HD == 128) && ROWS % 16 == 0, "panels of 64 channels, whole k-steps");
  return wgmma_desc(tile + static_cast<uint32_t>(kk * 16 * 128), ROWS * 128, 1024);
}

}  // namespace wm::cuda
