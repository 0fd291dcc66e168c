// Small device helpers shared by the kernels: launch geometry, warp
// reductions, bf16/fp16 bit casts. Device code only (.cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace wm::cuda {

inline constexpr int kThreads = 256;  // block size of the elementwise kernels

inline unsigned grid_for(int64_t items, int per_block = kThreads) {
  int64_t blocks = (items + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  // grid-stride loops cover the rest; 2^20 blocks saturate any GPU
  return static_cast<unsigned>(blocks > (int64_t{1} << 20) ? (int64_t{1} << 20) : blocks);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// two floats -> one register of two bf16, rounded as bf16_bits (lo = first)
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return bf16_bits(lo) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
}

__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace wm::cuda
