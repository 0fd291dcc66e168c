// x += dt_f * v per frame (values_per_frame each), then clamp to [-1, 1] if asked.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// dt_per_frame: device [frames_count]
cudaError_t launch_euler_step(float* x, const float* v, const float* dt_per_frame, int32_t frames_count,
                              int64_t values_per_frame, bool clamp, cudaStream_t stream);

}  // namespace wm::cuda
