// The host emulator's cuda/kernel_attrs.cuh: the same helpers over the
// emulated device (device_runtime.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device_runtime.h"

namespace wm::cuda {

template <class... Args>
cudaError_t allow_dynamic_smem(void (*kernel)(Args...), size_t bytes) {
  return simt::set_kernel_smem_limit(reinterpret_cast<const void*>(kernel), bytes);
}

template <class... Args>
int32_t resident_ctas(void (*kernel)(Args...), int threads, size_t smem_bytes) {
  return simt::resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem_bytes);
}

}  // namespace wm::cuda
