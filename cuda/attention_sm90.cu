// The attention kernel on Hopper's warpgroup MMA (wgmma, sm_90a only):
// attention_kernel.cuh with WgMma. One warpgroup (4 warps) per 64 query rows:
// block_q 64 is one, 128 two that share every key tile. Q stays in registers
// as the A operand of S = Q K^T; the K and V tiles are the B operands, read
// by the tensor cores straight from shared memory through descriptors, so
// they are stored in the 128-byte-swizzle layout (mma_layout.h: panel_swz,
// key_desc, value_desc); P is repacked from the S accumulators into the A
// registers of O += P V, as with mma.sync (docs/CUDA.md, "The Hopper kernel").
#include "cuda/attention_kernel.cuh"
#include "cuda/wgmma.cuh"

namespace wm::cuda {
namespace {

// O += P V over 16 keys: N = HD output channels in one instruction
template <int HD>
__device__ __forceinline__ void pv_mma(float (&o)[HD / 8][4], const uint32_t (&pa)[4], uint64_t desc) {
  if constexpr (HD == 64) {
    wgmma_m64n64k16<1>(o, pa, desc);
  } else {
    wgmma_m64n128k16<1>(o, pa, desc);
  }
}

struct WgMma {
  __host__ __device__ static constexpr int kThreads(int bq) { return bq * 2; }  // 128 threads per 64 rows
  __host__ __device__ static constexpr int kMinCtas(int) { return 1; }
  static constexpr bool kPanel = true;
  static constexpr uint32_t kAlign = 1024;  // swizzle groups start on 1024-byte boundaries
  // the cp.async writes become visible to wgmma, which reads through the async proxy
  __device__ static void smem_fence() { fence_proxy_async_smem(); }

  // S = Q K^T: the warpgroup's 64 rows against the tile's BK keys
  template <int HD, int BK>
  __device__ static void qk(float (&sc)[BK / 8][4], uint32_t (&qf)[HD / 16][4], uint32_t sk, int) {
    static_assert(BK == 64, "one m64n64k16 per 16 channels");
#pragma unroll
    for (int j = 0; j < BK / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    fence_regs(sc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) wgmma_m64n64k16<0>(sc, qf[kk], key_desc<HD, BK>(sk, kk));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sc);
    fence_regs(qf);
  }

  // O += P V, one m64n{HD}k16 per 16 keys
  template <int HD, int BK>
  __device__ static void pv(float (&o)[HD / 8][4], const float (&sc)[BK / 8][4], uint32_t sv, int) {
    uint32_t pa[BK / 16][4];
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pack_p<BK>(sc, kk, pa[kk]);
    fence_regs(o);
    fence_regs(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) pv_mma<HD>(o, pa[kk], value_desc<HD, BK>(sv, kk));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
  }
};

using Kernels = AttentionKernels<WgMma, 64, 128>;

}  // namespace

bool attention_sm90_supports(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

size_t attention_sm90_smem_bytes(int32_t head_dim, int32_t block_q) {
  return attention_kernel_smem<WgMma>(head_dim, block_q);
}

cudaError_t attention_sm90_prepare() { return Kernels::prepare(); }

int32_t attention_sm90_ctas_per_sm(int32_t head_dim, int32_t block_q) {
  return Kernels::ctas_per_sm(head_dim, block_q);
}

cudaError_t launch_attention_sm90(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                                  cudaStream_t stream) {
  return Kernels::launch(a, kv, head_dim, items, stream);
}

}  // namespace wm::cuda
