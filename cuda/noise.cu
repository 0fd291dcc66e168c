#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"
#include "cuda/noise.cuh"
#include "engine/noise.h"

namespace wm::cuda {
namespace {

// blockIdx.y: the frame; threads stride over its values
__global__ void noise_frames_kernel(const uint64_t* __restrict__ seeds, const int64_t* __restrict__ frames,
                                    int64_t values_per_frame, float* out) {
  const int32_t f = static_cast<int32_t>(blockIdx.y);
  const uint64_t seed = seeds[f];
  const int64_t frame = frames[f];
  float* o = out + static_cast<int64_t>(f) * values_per_frame;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < values_per_frame;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    o[e] = noise_normal(seed, frame, e);
}

}  // namespace

cudaError_t launch_noise_frames(const uint64_t* seeds, const int64_t* frames, int32_t count, int64_t values_per_frame,
                                float* out, cudaStream_t stream) {
  if (count <= 0 || values_per_frame <= 0) return cudaSuccess;
  if (count > 65535) return cudaErrorInvalidValue;
  const int64_t blocks = (values_per_frame + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(blocks < 1024 ? blocks : 1024), static_cast<unsigned>(count));
  return launch_kernel(noise_frames_kernel, grid, kThreads, 0, stream, seeds, frames, values_per_frame, out);
}

}  // namespace wm::cuda
