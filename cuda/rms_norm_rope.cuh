// In place on x [n, heads, head_dim] (row stride row_stride floats): per-head
// RMSNorm with weight [head_dim], then 3-D RoPE at pos [n, 3] (engine/rope.h).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// one channel pair's rotation: frequency and the position axis (0 t, 1 row, 2 col)
struct RopeFreq {
  double freq = 0;
  int32_t axis = 0;
  int32_t pad = 0;
};

// table: device [head_dim / 2]. x2 (with its own norm_w2) is a second
// tensor of the same shape done by the same launch (k beside q), or null.
// half (for x) and half2 (for x2), where not null: fp16 copies of the
// results in the attention kernels' layout [heads, n, head_dim], the bits
// launch_attention_inputs would make of them (4-byte aligned)
cudaError_t launch_rms_norm_rope(float* x, const float* norm_w, float* x2, const float* norm_w2, int32_t n,
                                 int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                                 const RopeFreq* table, float eps, cudaStream_t stream, uint16_t* half = nullptr,
                                 uint16_t* half2 = nullptr);

}  // namespace wm::cuda
