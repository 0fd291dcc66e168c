// The initial noise of a batch's frames on the device: frame i of `count` is
// engine/noise.h's noise_fill_frame(seeds[i], frames[i]) at out + i * values_per_frame.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// seeds, frames: device [count]
cudaError_t launch_noise_frames(const uint64_t* seeds, const int64_t* frames, int32_t count, int64_t values_per_frame,
                                float* out, cudaStream_t stream);

}  // namespace wm::cuda
