// y[n, d] = LN(x) * (1 + scale_f) + shift_f with f = row / tokens_per_frame
// (engine/backend.h), optionally also as bf16 rows [n, shadow_ld] for the next GEMM.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

cudaError_t launch_layer_norm_modulate(const float* x, int32_t n, int32_t d, const float* shift, const float* scale,
                                       int32_t mod_stride, int32_t tokens_per_frame, float eps, float* y,
                                       uint16_t* shadow, int32_t shadow_ld, cudaStream_t stream);

// h[n, d] += gate_f * ry (rows of gate at gate_stride), then y = LN(h) as
// above: gated_residual and layer_norm_modulate in one pass over h
cudaError_t launch_gated_residual_norm(float* h, const float* ry, const float* gate, int32_t gate_stride, int32_t n,
                                       int32_t d, const float* shift, const float* scale, int32_t mod_stride,
                                       int32_t tokens_per_frame, float eps, float* y, uint16_t* shadow,
                                       int32_t shadow_ld, cudaStream_t stream);

}  // namespace wm::cuda
