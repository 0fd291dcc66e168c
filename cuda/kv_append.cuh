// The write pass into the paged fp16 cache: fp32 K/V of whole frames go to
// their frame slots' pages (kv_layout.h, kv_pages.h). One launch writes the
// frames of every session of a batch: each write names its own page table.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "cuda/kv_layout.h"

namespace wm::cuda {

// one frame written: where it comes from and which cache's slot it goes to
struct KvFrameWrite {
  int32_t src_frame;     // frame offset in k/v (the batch's frames)
  int32_t slot;          // destination slot in its cache
  int32_t table;         // offset of its cache's page table [heads][pages_per_head] in page_tables
  int32_t pages_per_head;
};

struct KvAppendArgs {
  const float* k = nullptr;           // device [frames * tokens_per_frame, heads, head_dim], 16-byte aligned
  const float* v = nullptr;
  uint16_t* pool = nullptr;           // the page pool, fp16 bits
  int64_t page_elems = 0;             // 2 * page_tokens * head_dim
  int32_t page_tokens = 0, head_dim = 0, heads = 0, tokens_per_frame = 0;
  const KvFrameWrite* writes = nullptr;  // device [n_writes]
  int32_t n_writes = 0;
  const int32_t* page_tables = nullptr;  // device: each written cache's table of this layer, after the append
};

cudaError_t launch_kv_append(const KvAppendArgs& a, cudaStream_t stream);

// The write pass into KIVI-2 rows (kv_layout.h: KiviRowLayout). Window
// frames: their tokens, in chunks of `group`, are quantized as the CPU's
// KIVI-2 does (quant/kv_kivi.cc): every value sanitized (NaN to 0, clamped to
// fp16's range) and rounded to fp16 first, keys per channel over the chunk's
// tokens, values per token over groups of channels, min-max 2-bit with fp16
// scale and zero, codes chosen against the rounded scale and zero: the same
// codes bit for bit. Sink frames (`sinks`): sanitized fp16 into their units.
struct KvKiviAppendArgs {
  const float* k = nullptr;  // device [frames * tokens_per_frame, heads, head_dim]
  const float* v = nullptr;
  uint8_t* pool = nullptr;
  int64_t page_bytes = 0;
  KiviRowLayout row;
  int32_t heads = 0, tokens_per_frame = 0;
  const KvFrameWrite* writes = nullptr;  // device [n_writes], all sink frames or all window frames
  int32_t n_writes = 0;
  const int32_t* page_tables = nullptr;
  bool sinks = false;
};

cudaError_t launch_kv_append_kivi(const KvKiviAppendArgs& a, cudaStream_t stream);

// The write pass into QVG-2 / QuantWM-2 rows (kv_layout.h: SpanRowLayout):
// the device coder (span_encode.cuh) codes a write's window frames into a
// staging image, which this scatters into the pages; sink frames come
// straight from the fp32 K/V, sanitized fp16 into the front's units. A
// window write's image is [heads][T] token records (K residual, V
// residual, K id, V id, K PSAC record: span_token_bytes()), then, from the
// next multiple of 16 bytes, in the image of the span's first frame the
// pass stores, [heads] tables of its span (table_bytes each), which go to
// table `table_index`; every slot's map entry names that table.
struct KvSpanWrite {
  int32_t slot = 0;            // destination slot in its cache
  int32_t table = 0;           // offset of its cache's page table [heads][pages_per_head]
  int32_t pages_per_head = 0;
  int32_t sink = 0;            // 1: fp16 rows of a sink frame
  int32_t table_index = 0;     // its span's table in the ring
  int32_t src_frame = 0;       // a sink write's frame in k/v (the batch's frames)
  int32_t tables = 0;          // 1: this window write's image carries its span's tables
  int64_t staging = 0;         // a window write's image: its first byte in `staging` (a multiple of 16)
};

struct KvSpanAppendArgs {
  const float* k = nullptr;  // device [frames * tokens_per_frame, heads, head_dim], 16-byte aligned (sink writes)
  const float* v = nullptr;
  uint8_t* pool = nullptr;
  int64_t page_bytes = 0;
  SpanRowLayout row;
  int32_t heads = 0;
  const KvSpanWrite* writes = nullptr;  // device [n_writes]
  int32_t n_writes = 0;
  const int32_t* page_tables = nullptr;
  const uint8_t* staging = nullptr;     // device, 16-byte aligned
};

// bytes of one token's record in a window write's image, and where a
// window write's tables start in it
WM_HD_INLINE int32_t span_token_bytes(const SpanRowLayout& r) { return 2 * r.rec_bytes + 2 + r.coeff_bytes; }
WM_HD_INLINE int64_t span_tables_at(const SpanRowLayout& r, int32_t heads) {
  return (static_cast<int64_t>(heads) * r.tokens_per_frame * span_token_bytes(r) + 15) / 16 * 16;
}
WM_HD_INLINE int64_t span_image_bytes(const SpanRowLayout& r, int32_t heads, bool tables) {
  return span_tables_at(r, heads) + (tables ? static_cast<int64_t>(heads) * r.table_bytes() : 0);
}

cudaError_t launch_kv_append_span(const KvSpanAppendArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
