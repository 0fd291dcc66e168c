#include "cuda/device_util.cuh"
#include "cuda/rms_norm_rope.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

constexpr int kVectorsPerBlock = kThreads / 32;

// one warp per (token, head) vector. The sum of squares is taken in double
// and the angle reduced in double, as the CPU reference computes them, so
// that late frames (large time positions) rotate as accurately as early ones.
// blockIdx.y picks the tensor (q, or k of the same launch).
__global__ void rms_norm_rope_kernel(float* x0, const float* __restrict__ norm_w0, float* x1,
                                     const float* __restrict__ norm_w1, int32_t n, int32_t heads, int32_t head_dim,
                                     int32_t row_stride, const int32_t* __restrict__ pos,
                                     const RopeFreq* __restrict__ table, float eps) {
  float* x = blockIdx.y == 0 ? x0 : x1;
  const float* __restrict__ norm_w = blockIdx.y == 0 ? norm_w0 : norm_w1;
  const int lane = threadIdx.x & 31;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kVectorsPerBlock + (threadIdx.x >> 5);
  if (idx >= static_cast<int64_t>(n) * heads) return;
  const int64_t i = idx / heads;
  const int h = static_cast<int>(idx - i * heads);
  float* v = x + i * row_stride + static_cast<int64_t>(h) * head_dim;
  double ss = 0.0;
  for (int d = lane; d < head_dim; d += 32) ss += static_cast<double>(v[d]) * v[d];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = static_cast<float>(1.0 / sqrt(ss / head_dim + static_cast<double>(eps)));
  const int32_t* p = pos + 3 * i;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int j = lane; j < head_dim / 2; j += 32) {
    const float x0 = v[2 * j] * inv * norm_w[2 * j];
    const float x1 = v[2 * j + 1] * inv * norm_w[2 * j + 1];
    const RopeFreq f = table[j];
    const double phi = static_cast<double>(p[f.axis]) * f.freq;
    const double k = rint(phi * (1.0 / kTwoPi));
    const float r = static_cast<float>(fma(-k, kTwoPi, phi));
    float s, c;
    sincosf(r, &s, &c);
    v[2 * j] = x0 * c - x1 * s;
    v[2 * j + 1] = x0 * s + x1 * c;
  }
}

}  // namespace

cudaError_t launch_rms_norm_rope(float* x, const float* norm_w, float* x2, const float* norm_w2, int32_t n,
                                 int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                                 const RopeFreq* table, float eps, cudaStream_t stream) {
  const int64_t vectors = static_cast<int64_t>(n) * heads;
  if (vectors <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((vectors + kVectorsPerBlock - 1) / kVectorsPerBlock), x2 != nullptr ? 2 : 1);
  return launch_kernel(rms_norm_rope_kernel, grid, kThreads, 0, stream, x, norm_w, x2, norm_w2, n, heads, head_dim,
                       row_stride, pos, table, eps);
}

}  // namespace wm::cuda
