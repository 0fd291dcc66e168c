// The attention kernel on mma.sync.m16n8k16 (sm_80+, runs on every GPU the
// plugin accepts): attention_kernel.cuh with SyncMma (sync_mma.cuh), for
// head_dim 32, 64 and 128, over fp16 pages and over KIVI-2 pages.
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_launch.cuh"
#include "cuda/kv_format_kivi.cuh"
#include "cuda/sync_mma.cuh"

namespace wm::cuda {
namespace {

using Kernels = AttentionKernels<PlainAttention<SyncMma>, 32, 64, 128>;
using KiviKernels = AttentionKernels<PlainAttention<SyncMma, KiviPageFormat>, 32, 64, 128>;

}  // namespace

int32_t attention_ctas_per_sm(int32_t head_dim, int32_t block_q) { return Kernels::ctas_per_sm(head_dim, block_q); }

cudaError_t attention_prepare() {
  const cudaError_t e = Kernels::prepare();
  return e != cudaSuccess ? e : KiviKernels::prepare();
}

cudaError_t launch_attention(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                             cudaStream_t stream) {
  return Kernels::launch(a, kv, head_dim, items, stream);
}

cudaError_t launch_attention_kivi(const AttentionArgs& a, const PagedKvKiviView& kv, int32_t head_dim, int32_t items,
                                  cudaStream_t stream) {
  return KiviKernels::launch(a, kv, head_dim, items, stream);
}

}  // namespace wm::cuda
