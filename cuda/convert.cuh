// fp32 rows -> bf16 rows (the GEMM operands), zero-padding each row to `ld`.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// y[r * ld + c] = bf16(x[r * cols + c]) for c < cols, 0 for cols <= c < ld.
// x: [rows, cols] fp32, y: [rows, ld] bf16 bits
cudaError_t launch_f32_to_bf16(const float* x, int64_t rows, int32_t cols, int32_t ld, uint16_t* y,
                               cudaStream_t stream);

}  // namespace wm::cuda
