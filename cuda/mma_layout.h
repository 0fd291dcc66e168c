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
WM_HD uint32_t swz(int r, int c) {
  constexpr int kChunks = HD / 8;
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16, "head_dim 32, 64 or 128");
  const int cs = kChunks >= 8 ? (c ^ (r & 7)) : (c ^ ((r >> 1) & 3));
  return static_cast<uint32_t>((r * kChunks + cs) * 16);
}

// A operand (Q, 16 rows of warp w): ldmatrix.x4 of rows 16w + a_row, chunk a_chunk
WM_HD int a_row(int lane) { return lane & 15; }
WM_HD int a_chunk(int lane, int kk) { return 2 * kk + (lane >> 4); }

// B operand from K [keys][HD] (non-transposed ldmatrix.x4): key tiles 2jj, 2jj+1, channels 16kk..16kk+15
WM_HD int kb_row(int lane, int jj) { return 16 * jj + (lane & 7) + ((lane >> 4) << 3); }
WM_HD int kb_chunk(int lane, int kk) { return 2 * kk + ((lane >> 3) & 1); }

// B operand from V [keys][HD] (ldmatrix.x4.trans): keys 16kk..16kk+15, channel tiles 2jj, 2jj+1
WM_HD int vb_row(int lane, int kk) { return 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3); }
WM_HD int vb_chunk(int lane, int jj) { return 2 * jj + (lane >> 4); }

// accumulator element e (0..3) of a lane in a 16x8 tile
WM_HD int c_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
WM_HD int c_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }

// the S accumulators become the A operand of P V: A register i of k-step kk
// packs elements p_elem(i), p_elem(i) + 1 of key tile p_tile(kk, i)
WM_HD int p_tile(int kk, int i) { return 2 * kk + (i >> 1); }
WM_HD int p_elem(int i) { return 2 * (i & 1); }

}  // namespace wm::cuda
