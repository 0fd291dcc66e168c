// Every kernel launch of the plugin goes through launch_kernel:
// kernel<<<grid, block, smem, stream>>>(args...) and the launch's error.
// One place, so that the host emulator (tests/engine/simt/) can run the
// same launch code, grid arithmetic included, with its own launch.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace wm::cuda {

template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

}  // namespace wm::cuda
