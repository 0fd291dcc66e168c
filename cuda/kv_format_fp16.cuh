// The fp16 paged cache as a format type for the attention kernel
// (STYLE.md 5): a View passed by value, and load_tile, which fills one
// shared-memory K tile and V tile of kTileKeys keys. A quantized format
// plugs in with its own View and a load_tile that dequantizes into the same
// fp16 tiles (device code only).
#pragma once

#include <cstdint>

#include "cuda/kv_layout.h"
#include "cuda/tile_load.cuh"

namespace wm::cuda {

struct Fp16PageFormat {
  using View = PagedKvFp16View;

  // keys [first, first + kTileKeys) of one (layer, head), whose page-table
  // row is pt_row; rows past `valid` are zero-filled and never read. A tile
  // never crosses a page: page_tokens is a multiple of kTileKeys. PANEL: the
  // tiles are in the wgmma layout (mma_layout.h), in panels of PROWS rows;
  // LEAN: load_rows_async's.
  template <int HD, int NT, bool PANEL = false, bool LEAN = false, int PROWS = kTileKeys>
  __device__ __forceinline__ static void load_tile(const View& kv, const int32_t* pt_row, int32_t first,
                                                   int32_t valid, uint32_t sk, uint32_t sv, int tid) {
    const uint16_t* kb = kv.pool;
    const uint16_t* vb = kv.pool;
    if (valid > 0) {
      const int32_t page = pt_row[first / kv.page_tokens];
      const int32_t row = first % kv.page_tokens;
      kb = kv.pool + kv.k_offset(page, row);
      vb = kv.pool + kv.v_offset(page, row);
    }
    load_rows_async<HD, kTileKeys, NT, PANEL, LEAN, PROWS>(sk, kb, valid, kv.pool, tid);
    load_rows_async<HD, kTileKeys, NT, PANEL, LEAN, PROWS>(sv, vb, valid, kv.pool, tid);
  }
};

}  // namespace wm::cuda
