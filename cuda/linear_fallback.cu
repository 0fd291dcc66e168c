#include "cuda/device_util.cuh"
#include "cuda/linear_fallback.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

constexpr int kTile = 16;

__global__ void linear_fallback_kernel(const uint16_t* __restrict__ w, int32_t ld_w, const uint16_t* __restrict__ x,
                                       int32_t ld_x, const float* __restrict__ bias, int32_t n, int32_t in,
                                       int32_t out, float* __restrict__ y) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y;  // token
  const int col = blockIdx.x * kTile + threadIdx.x;  // output feature
  float acc = 0.0f;
  for (int k0 = 0; k0 < in; k0 += kTile) {
    const int kx = k0 + threadIdx.x;
    xs[threadIdx.y][threadIdx.x] =
        (row < n && kx < in) ? __bfloat162float(__ushort_as_bfloat16(x[static_cast<int64_t>(row) * ld_x + kx])) : 0.0f;
    const int wrow = blockIdx.x * kTile + threadIdx.y;
    ws[threadIdx.y][threadIdx.x] =
        (wrow < out && kx < in) ? __bfloat162float(__ushort_as_bfloat16(w[static_cast<int64_t>(wrow) * ld_w + kx]))
                                : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc += xs[threadIdx.y][k] * ws[threadIdx.x][k];
    __syncthreads();
  }
  if (row < n && col < out) y[static_cast<int64_t>(row) * out + col] = acc + (bias != nullptr ? bias[col] : 0.0f);
}

}  // namespace

cudaError_t launch_linear_fallback(const uint16_t* w, int32_t ld_w, const uint16_t* x, int32_t ld_x,
                                   const float* bias, int32_t n, int32_t in, int32_t out, float* y,
                                   cudaStream_t stream) {
  if (n <= 0 || out <= 0) return cudaSuccess;
  const dim3 block(kTile, kTile);
  const dim3 grid((out + kTile - 1) / kTile, (n + kTile - 1) / kTile);
  if (grid.y > 65535u) return cudaErrorInvalidConfiguration;
  return launch_kernel(linear_fallback_kernel, grid, block, 0, stream, w, ld_w, x, ld_x, bias, n, in, out, y);
}

}  // namespace wm::cuda
