// The attention kernel's inputs: q, k, v fp32 [rows, heads, head_dim] (the
// model's activations) -> fp16 [heads, rows, head_dim], so that each head's
// query tile and own-block key tile is one contiguous run the kernel can
// copy asynchronously like a cache page. Rows [first_row, rows) are
// converted (a call that attends only some of a batch's sessions: the rest
// is not read).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

// all pointers 16-byte aligned, head_dim a multiple of 8, 0 <= first_row <= rows;
// v_only: v alone (q16 and k16 were written with the RoPE: launch_rms_norm_rope's half copies)
cudaError_t launch_attention_inputs(const float* q, const float* k, const float* v, int32_t first_row, int32_t rows,
                                    int32_t heads, int32_t head_dim, uint16_t* q16, uint16_t* k16, uint16_t* v16,
                                    cudaStream_t stream, bool v_only = false);

}  // namespace wm::cuda
