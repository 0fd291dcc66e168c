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

#include <algorithm>
#include <cstdint>

#include "common/hd.h"

namespace wm::cuda {

inline constexpr int kTileKeys = 64;  // keys per attention tile (BK)

// the format view passed to kernels by value (STYLE.md 5)
struct PagedKvFp16View {
  const uint16_t* pool = nullptr;   // [capacity pages][page_elems] fp16 bits
  const int32_t* page_table = nullptr;  // plan snapshot (PlanSession::pt_offset)
  int64_t page_elems = 0;           // 2 * page_tokens * head_dim
  int32_t page_tokens = 0;
  int32_t head_dim = 0;
  // the pool as a tensor for TMA (cuda/tensor_map.h: encode_fp16_pool_map, a
  // CUtensorMap in device memory), or null; only the warp-specialised
  // kernel's TMA build reads it
  const void* tensor_map = nullptr;
  // element offsets of logical row `row` (< page_tokens) of page `page`
  WM_HD_INLINE int64_t k_offset(int32_t page, int32_t row) const {
    return static_cast<int64_t>(page) * page_elems + static_cast<int64_t>(row) * head_dim;
  }
  WM_HD_INLINE int64_t v_offset(int32_t page, int32_t row) const {
    return k_offset(page, row) + static_cast<int64_t>(page_tokens) * head_dim;
  }
};

// KIVI-2 pages (kv_format_kivi.cuh, quant/kv_kivi.cc). A page-table row (one
// session, layer and head) is a sequence of units of U = max(kTileKeys,
// group) logical tokens, so that a key tile never spans two units and a unit
// never spans two pages:
//
//   the sink frames' units, fp16:  K [U][head_dim] then V [U][head_dim]
//   then the window's units:       U / group chunks of
//     K: head_dim blocks BlockQ2Asym<group> (block d: channel d over the chunk's tokens)
//     V: group x (head_dim / group) blocks (token t, channels j*group..)
//   block = fp16 scale, fp16 zero, group / 4 code bytes (quant/kv_layouts.h)
//
// Units fill pages in order, as many whole units as fit; the window's first
// units share the page where the fp16 ones end (wm-default-64: its sink
// frame's unit and all 16 frames of its window fill one 64 KiB page).
struct KiviRowLayout {
  int32_t head_dim = 0, group = 0;  // group 0: not a KIVI-2 cache
  int32_t unit_tokens = 0;
  int32_t front_units = 0;              // fp16 units: the sink frames' tokens / unit_tokens
  int32_t fp16_unit_bytes = 0, q_unit_bytes = 0;
  int32_t fp16_per_page = 0, q_per_page = 0;  // whole units of each kind in one page
  int32_t shared_q = 0;  // quantized units in the page where the fp16 ones end (0 if they fill it)

  WM_HD_INLINE int32_t block_bytes() const { return 4 + group / 4; }
  WM_HD_INLINE int32_t chunk_bytes() const { return 2 * head_dim * block_bytes(); }
  WM_HD_INLINE int32_t front_tokens() const { return front_units * unit_tokens; }
  // page-table entry and byte offset inside that page of unit u
  WM_HD_INLINE void unit_at(int32_t u, int32_t* entry, int32_t* offset) const {
    if (u < front_units) {
      *entry = u / fp16_per_page;
      *offset = (u % fp16_per_page) * fp16_unit_bytes;
      return;
    }
    const int32_t q = u - front_units, last = front_units % fp16_per_page;
    if (q < shared_q) {
      *entry = front_units / fp16_per_page;
      *offset = last * fp16_unit_bytes + q * q_unit_bytes;
      return;
    }
    const int32_t rest = q - shared_q;
    *entry = (front_units + fp16_per_page - 1) / fp16_per_page + rest / q_per_page;
    *offset = (rest % q_per_page) * q_unit_bytes;
  }
  // page-table entries that hold the first `units` units
  WM_HD_INLINE int32_t entries_for(int32_t units) const {
    if (units <= 0) return 0;
    int32_t entry = 0, offset = 0;
    unit_at(units - 1, &entry, &offset);
    return entry + 1;
  }
};

// the row layout of KIVI-2 with `group` over pages of page_bytes, the sink
// frames' tokens (a multiple of the unit) fp16; group 0 if a page cannot
// hold a unit of each kind
inline KiviRowLayout kivi_row_layout(int64_t page_bytes, int32_t head_dim, int32_t group, int32_t front_tokens) {
  KiviRowLayout k;
  k.head_dim = head_dim;
  k.group = group;
  k.unit_tokens = group > kTileKeys ? group : kTileKeys;
  k.front_units = front_tokens / k.unit_tokens;
  k.fp16_unit_bytes = 4 * k.unit_tokens * head_dim;
  k.q_unit_bytes = k.unit_tokens / group * k.chunk_bytes();
  k.fp16_per_page = static_cast<int32_t>(page_bytes / k.fp16_unit_bytes);
  k.q_per_page = static_cast<int32_t>(page_bytes / k.q_unit_bytes);
  if (k.fp16_per_page <= 0 || k.q_per_page <= 0) {
    k.group = 0;
    return k;
  }
  const int32_t last = k.front_units % k.fp16_per_page;
  k.shared_q = last > 0 ? static_cast<int32_t>((page_bytes - static_cast<int64_t>(last) * k.fp16_unit_bytes) /
                                               k.q_unit_bytes)
                        : 0;
  return k;
}

// the view the attention kernel gets (by value) for KIVI-2 caches
struct PagedKvKiviView {
  const uint8_t* pool = nullptr;
  const int32_t* page_table = nullptr;  // plan snapshot
  int64_t page_bytes = 0;
  KiviRowLayout row;
};

// Rows cut into sections of equal items, each item whole inside one page:
// a section starts in the page where the one before it ends if an item
// still fits there, else on the next page. at(i): the page-table entry and
// byte offset of item i.
struct RowSection {
  int32_t item_bytes = 0, per_page = 0;  // per_page: whole items in one page
  int32_t first_entry = 0;               // the entry where the section starts
  int32_t first_offset = 0;              // its offset there (0: a fresh page)
  int32_t shared = 0;                    // items in that first, shared page (0 if first_offset is 0)
  WM_HD_INLINE void at(int32_t i, int32_t* entry, int32_t* offset) const {
    if (i < shared) {
      *entry = first_entry;
      *offset = first_offset + i * item_bytes;
      return;
    }
    const int32_t rest = i - shared;
    *entry = first_entry + (first_offset > 0 ? 1 : 0) + rest / per_page;
    *offset = (rest % per_page) * item_bytes;
  }
};

// QVG-2 / QuantWM-2 pages (kv_format_span.cuh, quant/kv_span.cc). Logical
// tokens are the fp16 layout's (slot * tokens_per_frame + t); a page-table
// row (one session, layer and head) holds three sections:
//
//   front: the sink frames' units of kTileKeys tokens, fp16 (KIVI-2's front)
//   units: the window's tokens from front_tokens on, kTileKeys to a unit:
//     K residual records [kTileKeys][rec_bytes]  (head_dim / block BlockQ2Sym<block>)
//     V residual records [kTileKeys][rec_bytes]
//     K ids [kTileKeys], V ids [kTileKeys]        (u8 centroid of each token)
//     K PSAC records [kTileKeys][coeff_bytes]     (QuantWM-2 only)
//   map: int32 [window slots]: the table of each window slot's span
//   tables: n_tables of them, one per live span (a ring: span i of a layer
//     takes table i mod n_tables): K centroids [max_centroids][head_dim]
//     fp16, V centroids [max_centroids][head_dim] fp16, then (QuantWM-2)
//     the PSAC basis [8][head_dim] fp16 the span was coded with
//
// Per-token data sits where the fp16 cache keeps the token, so a frame
// leaves the window with its slot; a span's centroids and basis stay in
// its table until its last frame has left.
struct SpanRowLayout {
  int32_t head_dim = 0, block = 0;  // block 0: not a span cache
  int32_t tokens_per_frame = 0;
  int32_t front_tokens = 0;         // sink frames' tokens, a multiple of kTileKeys
  int32_t rec_bytes = 0;            // one token's residual records on one side
  int32_t coeff_bytes = 0;          // one key's PSAC record (0: QVG-2)
  int32_t max_centroids = 0;        // rows of each slot's centroid tables
  int32_t window_units = 0, window_slots = 0;
  int32_t n_tables = 0;             // tables in the ring: at least the spans a layer can hold at once
  RowSection front, units, map, tables;
  int32_t entries = 0;              // page-table entries of a whole row

  WM_HD_INLINE int32_t front_units() const { return front_tokens / kTileKeys; }
  WM_HD_INLINE int32_t unit_bytes() const { return kTileKeys * (2 * rec_bytes + 2 + coeff_bytes); }
  WM_HD_INLINE int32_t v_recs() const { return kTileKeys * rec_bytes; }
  WM_HD_INLINE int32_t k_ids() const { return 2 * kTileKeys * rec_bytes; }
  WM_HD_INLINE int32_t v_ids() const { return k_ids() + kTileKeys; }
  WM_HD_INLINE int32_t k_coeffs() const { return v_ids() + kTileKeys; }
  WM_HD_INLINE int32_t table_bytes() const {
    return 2 * (2 * max_centroids * head_dim + (coeff_bytes > 0 ? 8 * head_dim : 0));
  }
  WM_HD_INLINE int32_t v_table() const { return 2 * max_centroids * head_dim; }
  WM_HD_INLINE int32_t basis_table() const { return 4 * max_centroids * head_dim; }
  // the window slot of a logical token past the front
  WM_HD_INLINE int32_t slot_of(int32_t logical) const { return (logical - front_tokens) / tokens_per_frame; }
  // page-table entries that hold the first `tokens` logical tokens: the
  // front's units, and with the first window token the whole row
  WM_HD_INLINE int32_t entries_for(int64_t tokens) const {
    if (tokens > front_tokens) return entries;
    const int32_t u = static_cast<int32_t>((tokens + kTileKeys - 1) / kTileKeys);
    if (u <= 0) return 0;
    int32_t entry = 0, offset = 0;
    front.at(u - 1, &entry, &offset);
    return entry + 1;
  }
};

// lays `count` items of `bytes` out from the cursor (entry, offset); false
// if a page cannot hold one
inline bool place_section(int64_t page_bytes, int32_t bytes, int32_t count, int32_t* entry, int32_t* offset,
                          RowSection* s) {
  s->item_bytes = bytes;
  if (count <= 0) {
    s->per_page = 1;
    s->first_entry = *entry;
    return true;
  }
  if (bytes <= 0 || bytes > page_bytes) return false;
  s->per_page = static_cast<int32_t>(page_bytes / bytes);
  s->first_entry = *entry;
  s->first_offset = *offset;
  s->shared = *offset > 0 ? static_cast<int32_t>(std::min<int64_t>(count, (page_bytes - *offset) / bytes)) : 0;
  int32_t e = 0, o = 0;
  s->at(count - 1, &e, &o);
  o += bytes;
  if (o >= page_bytes) {
    ++e;
    o = 0;
  }
  *entry = e;
  *offset = o;
  return true;
}

// the row layout of a span cache; block 0 if a page cannot hold an item
inline SpanRowLayout span_row_layout(int64_t page_bytes, int32_t head_dim, int32_t block, int32_t coeff_bytes,
                                     int32_t max_centroids, int32_t tokens_per_frame, int32_t sink_frames,
                                     int32_t window_frames, int32_t n_tables) {
  SpanRowLayout r;
  r.head_dim = head_dim;
  r.block = block;
  r.tokens_per_frame = tokens_per_frame;
  r.front_tokens = sink_frames * tokens_per_frame;
  r.rec_bytes = head_dim / block * (1 + block / 4);
  r.coeff_bytes = coeff_bytes;
  r.max_centroids = max_centroids;
  r.window_slots = window_frames;
  r.n_tables = n_tables;
  r.window_units = static_cast<int32_t>((static_cast<int64_t>(window_frames) * tokens_per_frame + kTileKeys - 1) /
                                        kTileKeys);
  int32_t entry = 0, offset = 0;
  const bool ok = place_section(page_bytes, 4 * kTileKeys * head_dim, r.front_units(), &entry, &offset, &r.front) &&
                  place_section(page_bytes, r.unit_bytes(), r.window_units, &entry, &offset, &r.units) &&
                  place_section(page_bytes, (4 * window_frames + 15) / 16 * 16, 1, &entry, &offset, &r.map) &&
                  place_section(page_bytes, r.table_bytes(), r.n_tables, &entry, &offset, &r.tables);
  if (!ok) r.block = 0;
  r.entries = offset > 0 ? entry + 1 : entry;
  return r;
}

// the view the attention kernel gets (by value) for span caches
struct PagedKvSpanView {
  const uint8_t* pool = nullptr;
  const int32_t* page_table = nullptr;  // plan snapshot
  int64_t page_bytes = 0;
  SpanRowLayout row;
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

WM_HD_INLINE int32_t clamp_tile_keys(int32_t remaining) {
  return remaining < 0 ? 0 : (remaining > kTileKeys ? kTileKeys : remaining);
}

WM_HD_INLINE TileRef tile_ref(const PlanSession& s, int32_t cached, int32_t tile) {
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

WM_HD_INLINE int32_t block_tiles(int32_t rows) { return (rows + kTileKeys - 1) / kTileKeys; }

// page-table row of (layer, head) of a session
WM_HD_INLINE int64_t page_row_offset(const PlanSession& s, int32_t layer, int32_t heads, int32_t head) {
  return s.pt_offset + (static_cast<int64_t>(layer) * heads + head) * s.pages_per_head;
}

}  // namespace wm::cuda
