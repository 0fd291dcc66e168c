// A plain tiled GEMM on CUDA cores for the shapes cuBLASLt has no algorithm
// for (and as the independent device check of the cuBLASLt path in tests):
// y[n, out] = x[n, in] W^T + b, bf16 inputs, fp32 accumulate and output.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// w: [out, ld_w] bf16, x: [n, ld_x] bf16, bias: [out] fp32 or null, y: [n, out] fp32
cudaError_t launch_linear_fallback(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x,
                                   const float* bias, int32_t n, int32_t in, int32_t out, float* y,
                                   cudaStream_t stream);

}  // namespace wm::cuda
