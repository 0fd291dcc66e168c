#include "cuda/bias_add.cuh"
#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

// blocks stride over rows, threads over a row
__global__ void bias_add_kernel(float* y, const float* __restrict__ bias, int32_t n, int32_t out) {
  for (int32_t i = blockIdx.x; i < n; i += gridDim.x) {
    float* yr = y + static_cast<int64_t>(i) * out;
    for (int32_t j = threadIdx.x; j < out; j += blockDim.x) yr[j] += bias[j];
  }
}

}  // namespace

cudaError_t launch_bias_add(float* y, const float* bias, int32_t n, int32_t out, cudaStream_t stream) {
  if (n <= 0 || out <= 0 || bias == nullptr) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(n < (1 << 20) ? n : (1 << 20));
  return launch_kernel(bias_add_kernel, blocks, kThreads, 0, stream, y, bias, n, out);
}

}  // namespace wm::cuda
