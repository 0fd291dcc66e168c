// The combine kernel of split-KV attention (attention_combine.cuh): device
// code, launched by attention_combine.cu and run by the host emulator's tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention.cuh"
#include "cuda/device_util.cuh"
#include "cuda/kv_layout.h"

namespace wm::cuda {

constexpr int kCombineWarps = 8;  // query rows per CTA, one warp each
constexpr int kCombineThreads = kCombineWarps * 32;

// CTAs of a query tile: its block_q rows, kCombineWarps at a time
__host__ __device__ constexpr int32_t combine_row_blocks(int32_t block_q) {
  return (block_q + kCombineWarps - 1) / kCombineWarps;
}

// (groups x row blocks, heads)
inline dim3 combine_grid(int32_t groups, int32_t heads, int32_t block_q) {
  return dim3(static_cast<unsigned>(groups * combine_row_blocks(block_q)), static_cast<unsigned>(heads));
}

// One warp per (query row, head), head_dim <= 128. The lanes first take the
// row's partials 32 at a time (running max and sum: one load each, the max
// and the denominator reduced across the warp), then hold 4 adjacent
// channels each while the partial rows are summed with their weights, which
// come from the lane that loaded them; the loads of several partials are in
// flight at once. Work is spread over as many warps as the launch has rows:
// a 64-query block over a long cache has one query tile and 10-20 partials
// per row, and a serial walk over them is latency, not bandwidth.
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(const AttentionArgs a, int32_t head_dim) {
  const int32_t row_blocks = combine_row_blocks(a.block_q);
  const CombineGroup gr = a.groups[blockIdx.x / row_blocks];
  const int head = blockIdx.y;
  const PlanSession s = a.sessions[gr.session];
  const int32_t q0 = gr.q_tile * a.block_q;
  const int32_t nq = min(a.block_q, s.rows - q0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = static_cast<int>(blockIdx.x % row_blocks) * kCombineWarps + warp;
  if (row >= nq) return;  // the whole warp: the shuffles below stay full-warp
  auto prow = [&](int k) { return (static_cast<int64_t>(gr.first_partial + k) * a.heads + head) * a.block_q + row; };

  float mstar = -INFINITY;
  for (int k = lane; k < gr.splits; k += 32) mstar = fmaxf(mstar, a.partial_ml[2 * prow(k)]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mstar = fmaxf(mstar, __shfl_xor_sync(0xffffffffu, mstar, off));

  const int col = 4 * lane;
  const bool has_col = col < head_dim;
  float den = 0.0f;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < gr.splits; k0 += 32) {
    // lane j: the weight of partial k0 + j (0 past the last one, and for a range that saw no key)
    float w = 0.0f;
    if (k0 + lane < gr.splits) {
      const float2 ml = *reinterpret_cast<const float2*>(a.partial_ml + 2 * prow(k0 + lane));
      w = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - mstar);
      den += w * ml.y;
    }
    const int n = min(32, gr.splits - k0);
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
      const float wk = __shfl_sync(0xffffffffu, w, j);
      if (has_col) {
        const float4 po = *reinterpret_cast<const float4*>(a.partial_o + prow(k0 + j) * head_dim + col);
        acc[0] += wk * po.x;
        acc[1] += wk * po.y;
        acc[2] += wk * po.z;
        acc[3] += wk * po.w;
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
  if (!has_col) return;
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  const int64_t at = ((static_cast<int64_t>(s.row0) + q0 + row) * a.heads + head) * head_dim + col;
  const float4 v = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
  *reinterpret_cast<float4*>(a.out + at) = v;
  if (a.out16 != nullptr)
    *reinterpret_cast<uint2*>(a.out16 + at) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

}  // namespace wm::cuda
