// The mma.sync policy of the attention kernel (attention_kernel.cuh), sm_80+,
// runs on every GPU the plugin accepts: one warp per 16 query rows, 4 warps
// (block_q 64) or 8 (block_q 128). K/V tiles in the swz layout
// (mma_layout.h), read by ldmatrix (.trans for V) without bank conflicts; the
// lane maps are tested on the CPU by cuda_host_test.cc, the whole kernel by
// the host emulator (simt_attention_test.cc). Device code only.
#pragma once

#include <cstdint>

#include "cuda/attention_tile.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_layout.h"

namespace wm::cuda {

struct SyncMma {
  __host__ __device__ static constexpr int kThreads(int bq) { return bq * 2; }
  __host__ __device__ static constexpr int kMinCtas(int bq) { return bq == 128 ? 1 : 2; }
  static constexpr bool kPanel = false;
  static constexpr uint32_t kAlign = 16;
  __device__ static void smem_fence() {}

  // S = Q K^T for this warp's 16 rows and the tile's BK keys
  template <int HD, int BK>
  __device__ static void qk(float (&sc)[BK / 8][4], const uint32_t (&qf)[HD / 16][4], uint32_t sk, int lane) {
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < BK / 16; ++jj) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + swz<HD>(kb_row(lane, jj), kb_chunk(lane, kk)));
        mma_16816(sc[2 * jj], qf[kk], b[0], b[1]);
        mma_16816(sc[2 * jj + 1], qf[kk], b[2], b[3]);
      }
  }

  // O += P V: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment of step kk
  template <int HD, int BK>
  __device__ static void pv(float (&o)[HD / 8][4], const float (&sc)[BK / 8][4], uint32_t sv, int lane) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t pa[4];
      pack_p<BK>(sc, kk, pa);
#pragma unroll
      for (int jj = 0; jj < HD / 16; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sv + swz<HD>(vb_row(lane, kk), vb_chunk(lane, jj)));
        mma_16816(o[2 * jj], pa, b[0], b[1]);
        mma_16816(o[2 * jj + 1], pa, b[2], b[3]);
      }
    }
  }
};

}  // namespace wm::cuda
