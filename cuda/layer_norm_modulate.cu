#include "cuda/device_util.cuh"
#include "cuda/layer_norm_modulate.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

// one warp per row; two passes for mean and variance like the CPU reference.
// RESIDUAL: first x += gate_f * ry (gated_residual), written back; each lane
// reads back only what it wrote itself.
template <bool RESIDUAL>
__global__ void layer_norm_modulate_kernel(float* x, const float* __restrict__ ry, const float* __restrict__ gate,
                                           int32_t gate_stride, int32_t n, int32_t d,
                                           const float* __restrict__ shift, const float* __restrict__ scale,
                                           int32_t mod_stride, int32_t tokens_per_frame, float eps, float* y,
                                           uint16_t* __restrict__ shadow, int32_t shadow_ld) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  const int64_t f = row / tokens_per_frame;
  float* xr = x + row * d;
  float sum = 0.0f;
  if constexpr (RESIDUAL) {
    const float* g = gate + f * gate_stride;
    const float* yr = ry + row * d;
    for (int j = lane; j < d; j += 32) {
      const float v = xr[j] + g[j] * yr[j];
      xr[j] = v;
      sum += v;
    }
  } else {
    for (int j = lane; j < d; j += 32) sum += xr[j];
  }
  const float mean = warp_sum(sum) / static_cast<float>(d);
  float var = 0.0f;
  for (int j = lane; j < d; j += 32) {
    const float t = xr[j] - mean;
    var += t * t;
  }
  var = warp_sum(var) / static_cast<float>(d);
  const float inv = 1.0f / sqrtf(var + eps);
  const float* sh = shift + f * mod_stride;
  const float* sc = scale + f * mod_stride;
  float* yr = y + row * d;
  uint16_t* br = shadow != nullptr ? shadow + row * shadow_ld : nullptr;
  for (int j = lane; j < d; j += 32) {
    const float v = (xr[j] - mean) * inv * (1.0f + sc[j]) + sh[j];
    yr[j] = v;
    if (br != nullptr) br[j] = bf16_bits(v);
  }
  if (br != nullptr)
    for (int j = d + lane; j < shadow_ld; j += 32) br[j] = 0;
}

}  // namespace

cudaError_t launch_layer_norm_modulate(const float* x, int32_t n, int32_t d, const float* shift, const float* scale,
                                       int32_t mod_stride, int32_t tokens_per_frame, float eps, float* y,
                                       uint16_t* shadow, int32_t shadow_ld, cudaStream_t stream) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((static_cast<int64_t>(n) + kRowsPerBlock - 1) / kRowsPerBlock);
  // without the residual the kernel never writes x
  return launch_kernel(layer_norm_modulate_kernel<false>, blocks, kThreads, 0, stream, const_cast<float*>(x),
                       static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), 0, n, d, shift, scale,
                       mod_stride, tokens_per_frame, eps, y, shadow, shadow_ld);
}

cudaError_t launch_gated_residual_norm(float* h, const float* ry, const float* gate, int32_t gate_stride, int32_t n,
                                       int32_t d, const float* shift, const float* scale, int32_t mod_stride,
                                       int32_t tokens_per_frame, float eps, float* y, uint16_t* shadow,
                                       int32_t shadow_ld, cudaStream_t stream) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((static_cast<int64_t>(n) + kRowsPerBlock - 1) / kRowsPerBlock);
  return launch_kernel(layer_norm_modulate_kernel<true>, blocks, kThreads, 0, stream, h, ry, gate, gate_stride, n, d,
                       shift, scale, mod_stride, tokens_per_frame, eps, y, shadow, shadow_ld);
}

}  // namespace wm::cuda
