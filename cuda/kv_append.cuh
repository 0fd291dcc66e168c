// The write pass into the paged fp16 cache: fp32 K/V of whole frames go to
// their frame slots' pages (kv_layout.h, kv_pages.h).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

struct KvAppendArgs {
  const float* k = nullptr;           // device [frames * tokens_per_frame, heads, head_dim], 16-byte aligned
  const float* v = nullptr;
  uint16_t* pool = nullptr;           // the page pool, fp16 bits
  int64_t page_elems = 0;             // 2 * page_tokens * head_dim
  int32_t page_tokens = 0, head_dim = 0, heads = 0, tokens_per_frame = 0;
  const int32_t* writes = nullptr;    // device [n_writes][2]: frame offset in k/v, destination slot
  int32_t n_writes = 0;
  const int32_t* page_table = nullptr;  // device [heads][pages_per_head] of this layer
  int32_t pages_per_head = 0;
};

cudaError_t launch_kv_append(const KvAppendArgs& a, cudaStream_t stream);

}  // namespace wm::cuda
