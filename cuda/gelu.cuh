// x = GELU_tanh(x) over `count` values, optionally also as bf16 (the next GEMM's input).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

cudaError_t launch_gelu(float* x, int64_t count, uint16_t* shadow, cudaStream_t stream);

}  // namespace wm::cuda
