// h[n, d] += gate_f * y[n, d], gate rows of frame f = row / tokens_per_frame at gate + f * mod_stride.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

cudaError_t launch_gated_residual(float* h, const float* y, const float* gate, int32_t mod_stride, int32_t n,
                                  int32_t d, int32_t tokens_per_frame, cudaStream_t stream);

}  // namespace wm::cuda
