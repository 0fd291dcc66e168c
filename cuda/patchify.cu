#include "cuda/device_util.cuh"
#include "cuda/patchify.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

// index in the frames of token element e (the map is a bijection)
__device__ __forceinline__ int64_t frame_index(int64_t e, const FrameGeom& s) {
  const int32_t p = s.patch, C = s.channels, gw = s.width / p;
  const int64_t T = static_cast<int64_t>(s.height / p) * gw, P = static_cast<int64_t>(C) * p * p;
  const int64_t f = e / (T * P);
  const int64_t rem = e - f * T * P;
  const int64_t n = rem / P;
  const int32_t k = static_cast<int32_t>(rem - n * P);
  const int32_t py = k / (p * C), px = (k / C) % p, ch = k % C;
  const int64_t r = n / gw, c = n % gw;
  return f * s.height * s.width * C + ((r * p + py) * s.width + (c * p + px)) * C + ch;
}

template <bool kToTokens>
__global__ void patchify_kernel(const float* __restrict__ src, int64_t total, FrameGeom s, float* __restrict__ dst) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kToTokens) {
      dst[e] = src[frame_index(e, s)];
    } else {
      dst[frame_index(e, s)] = src[e];
    }
  }
}

int64_t total_values(int32_t frames_count, const FrameGeom& s) {
  return static_cast<int64_t>(frames_count) * s.height * s.width * s.channels;
}

}  // namespace

cudaError_t launch_patchify(const float* frames, int32_t frames_count, const FrameGeom& s, float* tokens,
                            cudaStream_t stream) {
  const int64_t total = total_values(frames_count, s);
  if (total <= 0 || s.patch <= 0) return cudaSuccess;
  return launch_kernel(patchify_kernel<true>, grid_for(total), kThreads, 0, stream, frames, total, s, tokens);
}

cudaError_t launch_unpatchify(const float* tokens, int32_t frames_count, const FrameGeom& s, float* frames,
                              cudaStream_t stream) {
  const int64_t total = total_values(frames_count, s);
  if (total <= 0 || s.patch <= 0) return cudaSuccess;
  return launch_kernel(patchify_kernel<false>, grid_for(total), kThreads, 0, stream, tokens, total, s, frames);
}

}  // namespace wm::cuda
