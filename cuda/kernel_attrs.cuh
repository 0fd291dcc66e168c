// Host helpers around a kernel's launch attributes, shared by the kernels
// that need more than 48 KiB of dynamic shared memory.
#pragma once

#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

namespace wm::cuda {

// lets `kernel` be launched with `bytes` of dynamic shared memory
template <class... Args>
cudaError_t allow_dynamic_smem(void (*kernel)(Args...), size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// CTAs of `kernel` that one SM holds at once (the runtime's occupancy
// calculator); 0 if it cannot say
template <class... Args>
int32_t resident_ctas(void (*kernel)(Args...), int threads, size_t smem_bytes) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace wm::cuda
