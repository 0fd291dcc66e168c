// y[n, out] += bias[out]: for GEMMs whose cuBLASLt algorithm has no bias epilogue.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

cudaError_t launch_bias_add(float* y, const float* bias, int32_t n, int32_t out, cudaStream_t stream);

}  // namespace wm::cuda
