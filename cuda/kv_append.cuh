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

}  // namespace wm::cuda
