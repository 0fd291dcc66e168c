// Asynchronous loads of [rows][head_dim] fp16 tiles into swizzled shared
// memory (device code only), used for query tiles, own-block key tiles and
// by cache formats for their pages.
#pragma once

#include <cstdint>

#include "cuda/mma.cuh"

namespace wm::cuda {

// copies rows [0, valid) of src (row stride HD) into a ROWS x HD swizzled
// tile at shared address dst, zero-filling rows [valid, ROWS); `safe` is any
// valid global address (never read, cp.async wants one). PANEL: the wgmma
// layout (mma_layout.h: panel_swz) instead of swz, in panels of PROWS rows
// (ROWS, or more: the tile is rows [r0, r0 + ROWS) of a taller panel tile
// that starts r0 * 128 bytes before dst, r0 a multiple of 8). LEAN: the
// copies of a producer with few registers (attention_ws.cuh), unrolled
// twice: fully unrolled, their addresses took registers the consumers
// needed (a producer warp) or spilled (a producer warpgroup held to 40
// registers).
template <int HD, int ROWS, int NT, bool PANEL = false, bool LEAN = false, int PROWS = ROWS>
__device__ __forceinline__ void load_rows_async(uint32_t dst, const uint16_t* src, int valid, const void* safe,
                                                int tid) {
  constexpr int kChunks = HD / 8;
  static_assert((ROWS * kChunks) % NT == 0, "every thread copies the same number of chunks");
  static_assert(PROWS >= ROWS && PROWS % 8 == 0, "a panel holds the tile's rows in whole swizzle groups");
  [[maybe_unused]] constexpr int kUnroll = LEAN ? 2 : ROWS * kChunks / NT;
#pragma unroll kUnroll
  for (int k = 0; k < ROWS * kChunks / NT; ++k) {
    const int i = tid + k * NT;
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    const void* g = ok ? static_cast<const void*>(src + static_cast<int64_t>(r) * HD + c * 8) : safe;
    if constexpr (PANEL) {
      cp_async_16(dst + panel_swz<HD, PROWS>(r, c), g, ok);
    } else {
      cp_async_16(dst + swz<HD>(r, c), g, ok);
    }
  }
}

}  // namespace wm::cuda
