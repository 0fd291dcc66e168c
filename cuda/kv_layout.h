// The paged fp16 KV layout and the attention plan's records, shared by the
// host planner (attention_plan.cc), the kernels (attention.cu, kv_append.cu)
// and the host tests, which run the same index math on the CPU.
//
// Page pool: one device allocation of `capacity` pages of `page_bytes` each.
// A page holds `page_tokens` consecutive tokens of ONE (session, layer, head):
//
//   page = K [page_tokens][head_dim] fp16, then V [page_tokens][head_dim] fp16
//   page_tokens = page_bytes / (4 * head_dim)        (a multiple of kTileKeys)
//
// A session's cache of one (layer, head) is the sequence of "logical tokens"
// slot * tokens_per_frame + t, where frame slots 0..S-1 hold the sink frames
// and S..S+W-1 hold the window as a ring (kv_pages.h); logical token j lives
// in page table entry j / page_tokens at row j % page_tokens. The cached
// tokens of a layer are always the prefix [0, used_tokens): attention is
// order-free over keys, so the ring needs no reordering.
//
// Everything here is plain data with __host__ __device__ helpers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WM_HD __host__ __device__ __forceinline__
#else
#define WM_HD inline
#endif

namespace wm::cuda {

inline constexpr int kTileKeys = 64;  // keys per attention tile (BK)

// the format view passed to kernels by value (STYLE.md 5)
struct PagedKvFp16View {
  const uint16_t* pool = nullptr;   // [capacity pages][page_elems] fp16 bits
  const int32_t* page_table = nullptr;  // plan snapshot (PlanSession::pt_offset)
  int64_t page_elems = 0;           // 2 * page_tokens * head_dim
  int32_t page_tokens = 0;
  int32_t head_dim = 0;
  // element offsets of logical row `row` (< page_tokens) of page `page`
  WM_HD int64_t k_offset(int32_t page, int32_t row) const {
    return static_cast<int64_t>(page) * page_elems + static_cast<int64_t>(row) * head_dim;
  }
  WM_HD int64_t v_offset(int32_t page, int32_t row) const {
    return k_offset(page, row) + static_cast<int64_t>(page_tokens) * head_dim;
  }
};

// one session of a planned attention launch
struct PlanSession {
  int64_t pt_offset = 0;       // first entry of this session's page table [layers][heads][pages_per_head]
  int32_t row0 = 0;            // first row of its queries (and own-block keys) in q, k, v, out
  int32_t rows = 0;            // queries = own-block keys
  int32_t cache_tiles = 0;     // ceil(most cached tokens over layers / kTileKeys)
  int32_t pages_per_head = 0;  // length of one page-table row
};
static_assert(sizeof(PlanSession) == 24, "PlanSession layout is shared with the device");

// one CTA row of the launch (times heads in grid.y): queries
// [q_tile * block_q, +block_q) of a session against key tiles
// [tile_begin, tile_end) of its tile space (cache tiles, then own-block tiles)
struct WorkItem {
  int32_t session = 0;
  int32_t q_tile = 0;
  int32_t tile_begin = 0;
  int32_t tile_end = 0;
  int32_t partial = -1;  // -1: write the output; else index of its partial result
};
static_assert(sizeof(WorkItem) == 20, "WorkItem layout is shared with the device");

// the partial results of one (session, q tile) split across KV ranges
struct CombineGroup {
  int32_t session = 0;
  int32_t q_tile = 0;
  int32_t first_partial = 0;  // partials first_partial .. first_partial + splits - 1
  int32_t splits = 0;
};
static_assert(sizeof(CombineGroup) == 16, "CombineGroup layout is shared with the device");

// where the keys of tile `tile` of a session come from, for a layer whose
// cache holds `cached` tokens
struct TileRef {
  bool from_cache = false;  // cache (paged) or the session's own block (rows of k, v)
  int32_t first = 0;        // cache: first logical token; block: first row relative to row0
  int32_t valid = 0;        // keys in this tile (0..kTileKeys); the rest are masked
};

WM_HD int32_t clamp_tile_keys(int32_t remaining) {
  return remaining < 0 ? 0 : (remaining > kTileKeys ? kTileKeys : remaining);
}

WM_HD TileRef tile_ref(const PlanSession& s, int32_t cached, int32_t tile) {
  TileRef t;
  if (tile < s.cache_tiles) {
    t.from_cache = true;
    t.first = tile * kTileKeys;
    t.valid = clamp_tile_keys(cached - t.first);
  } else {
    t.from_cache = false;
    t.first = (tile - s.cache_tiles) * kTileKeys;
    t.valid = clamp_tile_keys(s.rows - t.first);
  }
  return t;
}

WM_HD int32_t block_tiles(int32_t rows) { return (rows + kTileKeys - 1) / kTileKeys; }

// page-table row of (layer, head) of a session
WM_HD int64_t page_row_offset(const PlanSession& s, int32_t layer, int32_t heads, int32_t head) {
  return s.pt_offset + (static_cast<int64_t>(layer) * heads + head) * s.pages_per_head;
}

}  // namespace wm::cuda
