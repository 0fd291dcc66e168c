#include "cuda/device_util.cuh"
#include "cuda/euler_step.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

__global__ void euler_step_kernel(float* x, const float* __restrict__ v, const float* __restrict__ dt_per_frame,
                                  int64_t values_per_frame, bool clamp) {
  const int64_t f = blockIdx.y;
  const float dt = dt_per_frame[f];
  float* xf = x + f * values_per_frame;
  const float* vf = v + f * values_per_frame;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < values_per_frame;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float y = xf[i] + dt * vf[i];
    if (clamp) y = fminf(1.0f, fmaxf(-1.0f, y));
    xf[i] = y;
  }
}

}  // namespace

cudaError_t launch_euler_step(float* x, const float* v, const float* dt_per_frame, int32_t frames_count,
                              int64_t values_per_frame, bool clamp, cudaStream_t stream) {
  if (frames_count <= 0 || values_per_frame <= 0) return cudaSuccess;
  if (frames_count > 65535) return cudaErrorInvalidConfiguration;
  unsigned bx = grid_for(values_per_frame);
  if (bx > 4096u) bx = 4096u;
  return launch_kernel(euler_step_kernel, dim3(bx, static_cast<unsigned>(frames_count)), kThreads, 0, stream, x, v,
                       dt_per_frame, values_per_frame, clamp);
}

}  // namespace wm::cuda
