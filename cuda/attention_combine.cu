#include "cuda/attention_combine.cuh"
#include "cuda/attention_combine_kernel.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {

cudaError_t launch_attention_combine(const AttentionArgs& a, int32_t head_dim, int32_t groups, cudaStream_t stream) {
  if (groups <= 0 || a.heads <= 0) return cudaSuccess;
  if (head_dim > 128 || head_dim % 4 != 0 || a.heads > 65535) return cudaErrorInvalidValue;
  return launch_kernel(attention_combine_kernel, combine_grid(groups, a.heads, a.block_q), kCombineThreads, 0, stream,
                       a, head_dim);
}

}  // namespace wm::cuda
