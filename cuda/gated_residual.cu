#include "cuda/device_util.cuh"
#include "cuda/gated_residual.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

// blocks stride over rows, threads over a row: one division per row, not per value
__global__ void gated_residual_kernel(float* h, const float* __restrict__ y, const float* __restrict__ gate,
                                      int32_t mod_stride, int32_t n, int32_t d, int32_t tokens_per_frame) {
  for (int32_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* g = gate + static_cast<int64_t>(i / tokens_per_frame) * mod_stride;
    float* hr = h + static_cast<int64_t>(i) * d;
    const float* yr = y + static_cast<int64_t>(i) * d;
    for (int32_t j = threadIdx.x; j < d; j += blockDim.x) hr[j] += g[j] * yr[j];
  }
}

}  // namespace

cudaError_t launch_gated_residual(float* h, const float* y, const float* gate, int32_t mod_stride, int32_t n,
                                  int32_t d, int32_t tokens_per_frame, cudaStream_t stream) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(n < (1 << 20) ? n : (1 << 20));
  return launch_kernel(gated_residual_kernel, blocks, kThreads, 0, stream, h, y, gate, mod_stride, n, d,
                       tokens_per_frame);
}

}  // namespace wm::cuda
