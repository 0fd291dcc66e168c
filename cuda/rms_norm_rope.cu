#include "cuda/device_util.cuh"
#include "cuda/rms_norm_rope.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

constexpr int kVectorsPerBlock = kThreads / 32;

// one warp per (token, head) vector. The sum of squares is taken in double
// and the angle reduced in double, as the CPU reference computes them, so
// that late frames (large time positions) rotate as accurately as early ones.
// blockIdx.y picks the tensor (q, or k of the same launch); where its fp16
// copy is given, each value written goes there too, rounded as
// attention_inputs rounds it
__global__ void rms_norm_rope_kernel(float* x0, const float* __restrict__ norm_w0, float* x1,
                                     const float* __restrict__ norm_w1, int32_t n, int32_t heads, int32_t head_dim,
                                     int32_t row_stride, const int32_t* __restrict__ pos,
                                     const RopeFreq* __restrict__ table, float eps, uint16_t* half0, uint16_t* half1) {
  float* x = blockIdx.y == 0 ? x0 : x1;
  const float* __restrict__ norm_w = blockIdx.y == 0 ? norm_w0 : norm_w1;
  uint16_t* half = blockIdx.y == 0 ? half0 : half1;
  const int lane = threadIdx.x & 31;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kVectorsPerBlock + (threadIdx.x >> 5);
  if (idx >= static_cast<int64_t>(n) * heads) return;
  const int64_t i = idx / heads;
  const int h = static_cast<int>(idx - i * heads);
  float* v = x + i * row_stride + static_cast<int64_t>(h) * head_dim;
  // [heads, n, head_dim]: attention_inputs' layout
  uint32_t* out16 = half != nullptr ? reinterpret_cast<uint32_t*>(half + (static_cast<int64_t>(h) * n + i) * head_dim)
                                    : nullptr;
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
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    v[2 * j] = y0;
    v[2 * j + 1] = y1;
    if (out16 != nullptr) out16[j] = f16_bits(y0) | (static_cast<uint32_t>(f16_bits(y1)) << 16);
  }
}

}  // namespace

cudaError_t launch_rms_norm_rope(float* x, const float* norm_w, float* x2, const float* norm_w2, int32_t n,
                                 int32_t heads, int32_t head_dim, int32_t row_stride, const int32_t* pos,
                                 const RopeFreq* table, float eps, cudaStream_t stream, uint16_t* half,
                                 uint16_t* half2) {
  const int64_t vectors = static_cast<int64_t>(n) * heads;
  if (vectors <= 0) return cudaSuccess;
  if ((half != nullptr || half2 != nullptr) &&
      (reinterpret_cast<uintptr_t>(half) % 4 != 0 || reinterpret_cast<uintptr_t>(half2) % 4 != 0 ||
       (half2 != nullptr && x2 == nullptr)))
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((vectors + kVectorsPerBlock - 1) / kVectorsPerBlock), x2 != nullptr ? 2 : 1);
  return launch_kernel(rms_norm_rope_kernel, grid, kThreads, 0, stream, x, norm_w, x2, norm_w2, n, heads, head_dim,
                       row_stride, pos, table, eps, half, half2);
}

}  // namespace wm::cuda
