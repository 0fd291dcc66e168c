#include "cuda/convert.cuh"
#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

// 8 values per thread, 16-byte loads and stores
__global__ void f32_to_bf16_flat8(const float* __restrict__ x, int64_t n8, uint16_t* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 a = reinterpret_cast<const float4*>(x)[2 * i];
    const float4 b = reinterpret_cast<const float4*>(x)[2 * i + 1];
    uint4 o;
    o.x = pack_bf16x2(a.x, a.y);
    o.y = pack_bf16x2(a.z, a.w);
    o.z = pack_bf16x2(b.x, b.y);
    o.w = pack_bf16x2(b.z, b.w);
    reinterpret_cast<uint4*>(y)[i] = o;
  }
}

__global__ void f32_to_bf16_rows(const float* __restrict__ x, int64_t rows, int32_t cols, int32_t ld,
                                 uint16_t* __restrict__ y) {
  const int64_t total = rows * ld;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld;
    const int32_t c = static_cast<int32_t>(i - r * ld);
    y[i] = c < cols ? bf16_bits(x[r * cols + c]) : uint16_t{0};
  }
}

}  // namespace

cudaError_t launch_f32_to_bf16(const float* x, int64_t rows, int32_t cols, int32_t ld, uint16_t* y,
                               cudaStream_t stream) {
  const int64_t total = rows * ld;
  if (total <= 0) return cudaSuccess;
  const bool flat = ld == cols && cols % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                    (reinterpret_cast<uintptr_t>(y) & 15u) == 0;
  if (flat) return launch_kernel(f32_to_bf16_flat8, grid_for(total / 8), kThreads, 0, stream, x, total / 8, y);
  return launch_kernel(f32_to_bf16_rows, grid_for(total), kThreads, 0, stream, x, rows, cols, ld, y);
}

}  // namespace wm::cuda
