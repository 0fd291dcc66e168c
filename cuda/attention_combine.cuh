// Merges the partial softmax results of split KV ranges (attention.cuh) into
// the output: O = sum_k 2^(m_k - m) o_k / sum_k 2^(m_k - m) l_k, m = max_k m_k.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "cuda/attention.cuh"

namespace wm::cuda {

// grid (groups x query-row blocks, heads), one warp per query row and head
cudaError_t launch_attention_combine(const AttentionArgs& a, int32_t head_dim, int32_t groups, cudaStream_t stream);

}  // namespace wm::cuda
