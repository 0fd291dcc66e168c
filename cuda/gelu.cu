#include "cuda/device_util.cuh"
#include "cuda/gelu.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

__global__ void gelu_kernel(float* x, int64_t count, uint16_t* __restrict__ shadow) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gelu_tanh(x[i]);
    x[i] = g;
    if (shadow != nullptr) shadow[i] = bf16_bits(g);
  }
}

// 4 values per thread, 16-byte loads
__global__ void gelu_kernel4(float* x, int64_t count4, uint16_t* __restrict__ shadow) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 v = reinterpret_cast<float4*>(x)[i];
    v.x = gelu_tanh(v.x);
    v.y = gelu_tanh(v.y);
    v.z = gelu_tanh(v.z);
    v.w = gelu_tanh(v.w);
    reinterpret_cast<float4*>(x)[i] = v;
    if (shadow != nullptr) {
      uint2 b;
      b.x = bf16_bits(v.x) | (static_cast<uint32_t>(bf16_bits(v.y)) << 16);
      b.y = bf16_bits(v.z) | (static_cast<uint32_t>(bf16_bits(v.w)) << 16);
      reinterpret_cast<uint2*>(shadow)[i] = b;
    }
  }
}

}  // namespace

cudaError_t launch_gelu(float* x, int64_t count, uint16_t* shadow, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const bool vec = count % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(shadow) & 7u) == 0;
  if (vec) return launch_kernel(gelu_kernel4, grid_for(count / 4), kThreads, 0, stream, x, count / 4, shadow);
  return launch_kernel(gelu_kernel, grid_for(count), kThreads, 0, stream, x, count, shadow);
}

}  // namespace wm::cuda
