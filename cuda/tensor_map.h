// The fp16 page pool, and the rows of a block's own keys and values, as
// tensors the TMA copies key tiles of (attention_ws.cuh): host-side
// encodings through cuTensorMapEncodeTiled,
// which the caller passes in (the driver's, found at run time so that the
// plugin does not link libcuda; the emulator's, in tests). Header only.
//
// A page is [K: page_tokens rows][V: page_tokens rows] of head_dim fp16
// (kv_layout.h: PagedKvFp16View), so the pool is the 3-d tensor
// [pages][2 page_tokens][head_dim] with a page stride of page_bytes. A box
// is 64 channels (128 bytes, the 128-byte swizzle's span: mma_layout.h's
// panel_swz) by `box_rows` rows of one page; V's rows start at page_tokens.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace wm::cuda {

using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

inline constexpr int kTmaBoxChannels = 64;  // fp16 channels in the 128-byte swizzle's span

// CUDA_ERROR_INVALID_VALUE where the shape cannot be a tensor map (the
// driver's own checks follow: alignment, strides, box sizes)
inline CUresult encode_fp16_pool_map(TensorMapEncodeTiled encode, CUtensorMap* map, const void* pool, int64_t pages,
                                     int64_t page_bytes, int32_t head_dim, int32_t page_tokens, int32_t box_rows) {
  if (encode == nullptr || pool == nullptr || pages <= 0 || head_dim % kTmaBoxChannels != 0 || page_tokens <= 0 ||
      box_rows <= 0 || box_rows > 2 * page_tokens || static_cast<int64_t>(4) * page_tokens * head_dim > page_bytes)
    return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(2 * page_tokens),
                              static_cast<cuuint64_t>(pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 2, static_cast<cuuint64_t>(page_bytes)};
  const cuuint32_t box[3] = {kTmaBoxChannels, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void*>(pool), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// rows of head_dim fp16 values, one after another from `base` (the
// session's own keys and values, attention_inputs.cuh): the 3-d tensor
// [1][rows][head_dim], boxes of 64 channels by `box_rows` rows
inline CUresult encode_rows_map(TensorMapEncodeTiled encode, CUtensorMap* map, const void* base, int64_t rows,
                                int32_t head_dim, int32_t box_rows) {
  if (encode == nullptr || base == nullptr || rows <= 0 || rows > (int64_t{1} << 31) ||
      head_dim % kTmaBoxChannels != 0 || box_rows <= 0 || box_rows > 256)
    return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(head_dim) * 2;
  const cuuint64_t strides[2] = {row_bytes, row_bytes * static_cast<cuuint64_t>(rows)};
  const cuuint32_t box[3] = {kTmaBoxChannels, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace wm::cuda
