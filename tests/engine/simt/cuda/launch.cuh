// The host emulator's cuda/launch.cuh: launch_kernel runs the kernel on the
// emulated device (device_runtime.h) with the arguments converted to the
// kernel's parameter types once, as a launch copies them (and keeps them
// for a graph while its stream records).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "device_runtime.h"
#include "simt_runtime.h"

namespace wm::cuda {

template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
                          Args&&... args) {
  // the body owns its copy of the arguments: a recorded launch runs later
  auto params = std::make_shared<const std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  return simt::launch_on_device(reinterpret_cast<const void*>(kernel), grid, block, smem,
                                [kernel, params] { std::apply(kernel, *params); });
}

}  // namespace wm::cuda
