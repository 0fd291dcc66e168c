// The host side of the attention kernels: every instantiation of a kernel
// family (attention_kernel.cuh's PlainAttention, attention_sm90.cuh's
// OverlapAttention), its shared-memory limit, occupancy and launch, chosen
// at run time by head_dim and block_q. Compiled by nvcc only (the kernels
// themselves are plain device code that tests also build on the host).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "cuda/attention.cuh"
#include "cuda/kernel_attrs.cuh"
#include "cuda/kv_layout.h"
#include "cuda/launch.cuh"

namespace wm::cuda {

// every instantiation of one kernel family, for head sizes HDs and block_q
// 64 and 128, chosen at run time
template <class Family, int... HDs>
struct AttentionKernels {
  using View = typename Family::View;
  template <int HD, int BQ>
  static cudaError_t allow_smem() {
    return allow_dynamic_smem(Family::template kernel<HD, BQ>(), Family::smem(HD, BQ));
  }
  template <int HD, int BQ>
  static int32_t ctas() {
    return resident_ctas(Family::template kernel<HD, BQ>(), Family::threads(BQ), Family::smem(HD, BQ));
  }
  // grid: work items x heads
  template <int HD, int BQ>
  static cudaError_t launch_one(const AttentionArgs& a, const View& kv, int32_t items,
                                cudaStream_t stream) {
    return launch_kernel(Family::template kernel<HD, BQ>(),
                         dim3(static_cast<unsigned>(items), static_cast<unsigned>(a.heads)), Family::threads(BQ),
                         Family::smem(HD, BQ), stream, a, kv);
  }

  // raises every instantiation's shared-memory limit (once per device); the first error
  static cudaError_t prepare() {
    cudaError_t e = cudaSuccess;
    auto keep = [&](cudaError_t r) {
      if (r != cudaSuccess && e == cudaSuccess) e = r;
    };
    (keep(allow_smem<HDs, 64>()), ...);
    (keep(allow_smem<HDs, 128>()), ...);
    return e;
  }
  // CTAs per SM for (head_dim, block_q); 0 if unknown
  static int32_t ctas_per_sm(int32_t head_dim, int32_t block_q) {
    int32_t n = 0;
    ((head_dim == HDs && (n = block_q == 128 ? ctas<HDs, 128>() : ctas<HDs, 64>(), true)) || ...);
    return n;
  }
  static cudaError_t launch(const AttentionArgs& a, const View& kv, int32_t head_dim, int32_t items,
                            cudaStream_t stream) {
    if (items <= 0 || a.heads <= 0) return cudaSuccess;
    if (a.heads > 65535) return cudaErrorInvalidConfiguration;
    if (a.block_q != 64 && a.block_q != 128) return cudaErrorInvalidValue;
    cudaError_t e = cudaErrorInvalidValue;
    ((head_dim == HDs && (e = a.block_q == 128 ? launch_one<HDs, 128>(a, kv, items, stream)
                                               : launch_one<HDs, 64>(a, kv, items, stream),
                          true)) ||
     ...);
    return e;
  }
};

}  // namespace wm::cuda
