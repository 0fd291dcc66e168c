// out[b, r, :] = rows[r, :] + per_block[b, :] (engine/backend.h add_rows):
// every layer's modulation from one upload of the frames' conditioning.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

cudaError_t launch_add_rows(const float* rows, const float* per_block, int32_t n_rows, int32_t blocks, int32_t width,
                            float* out, cudaStream_t stream);

}  // namespace wm::cuda
