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

// table: device [head_dim / 2]
cudaError_t launch_rms_norm_rope(float* x, int32_t n, int32_t heads, int32_t head_dim, int32_t row_stride,
                                 const float* norm_w, const int32_t* pos, const RopeFreq* table, float eps,
                                 cudaStream_t stream);

}  // namespace wm::cuda
