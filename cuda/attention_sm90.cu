// The Hopper attention kernels (attention_sm90.cuh), compiled for sm_90a
// only: their instantiations and host entry points (attention.cuh).
#include "cuda/attention_launch.cuh"
#include "cuda/attention_sm90.cuh"

namespace wm::cuda {
namespace {

using Kernels = AttentionKernels<PlainAttention<WgMma>, 64, 128>;
using OverlapKernels = AttentionKernels<OverlapAttention, 64, 128>;

}  // namespace

bool attention_sm90_supports(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

size_t attention_sm90_smem_bytes(int32_t head_dim, int32_t block_q, bool overlap) {
  return overlap ? OverlapAttention::smem(head_dim, block_q) : attention_kernel_smem<WgMma>(head_dim, block_q);
}

cudaError_t attention_sm90_prepare() {
  const cudaError_t e = Kernels::prepare();
  return e != cudaSuccess ? e : OverlapKernels::prepare();
}

int32_t attention_sm90_ctas_per_sm(int32_t head_dim, int32_t block_q, bool overlap) {
  return overlap ? OverlapKernels::ctas_per_sm(head_dim, block_q) : Kernels::ctas_per_sm(head_dim, block_q);
}

cudaError_t launch_attention_sm90(const AttentionArgs& a, const PagedKvFp16View& kv, int32_t head_dim, int32_t items,
                                  bool overlap, cudaStream_t stream) {
  return overlap ? OverlapKernels::launch(a, kv, head_dim, items, stream)
                 : Kernels::launch(a, kv, head_dim, items, stream);
}

}  // namespace wm::cuda
