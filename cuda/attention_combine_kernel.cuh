// The combine kernel of split-KV attention (attention_combine.cuh): device
// code, launched by attention_combine.cu and run by the host emulator's tests.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention.cuh"
#include "cuda/kv_layout.h"

namespace wm::cuda {

constexpr int kCombineWarps = 4;

// one warp per query row, lanes over head_dim (<= 128: 4 columns per lane)
__global__ void attention_combine_kernel(const AttentionArgs a, int32_t head_dim) {
  const CombineGroup gr = a.groups[blockIdx.x];
  const int head = blockIdx.y;
  const PlanSession s = a.sessions[gr.session];
  const int32_t q0 = gr.q_tile * a.block_q;
  const int32_t nq = min(a.block_q, s.rows - q0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int row = warp; row < nq; row += kCombineWarps) {
    float mstar = -INFINITY;
    for (int k = 0; k < gr.splits; ++k) {
      const int64_t prow = (static_cast<int64_t>(gr.first_partial + k) * a.heads + head) * a.block_q + row;
      mstar = fmaxf(mstar, a.partial_ml[2 * prow]);
    }
    float den = 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < gr.splits; ++k) {
      const int64_t prow = (static_cast<int64_t>(gr.first_partial + k) * a.heads + head) * a.block_q + row;
      const float mk = a.partial_ml[2 * prow], lk = a.partial_ml[2 * prow + 1];
      const float wk = mk == -INFINITY ? 0.0f : exp2f(mk - mstar);
      den += wk * lk;
      const float* po = a.partial_o + prow * head_dim;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (lane + 32 * c < head_dim) acc[c] += wk * po[lane + 32 * c];
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    float* dst = a.out + ((static_cast<int64_t>(s.row0) + q0 + row) * a.heads + head) * head_dim;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (lane + 32 * c < head_dim) dst[lane + 32 * c] = acc[c] * inv;
  }
}

}  // namespace wm::cuda
