// frames [frames, H, W, C] <-> tokens [frames * T, P] (docs/MODEL_FORMAT.md,
// "Frames and tokens"); one index map, used in both directions.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace wm::cuda {

struct FrameGeom {
  int32_t height = 0, width = 0, channels = 0, patch = 0;
};

cudaError_t launch_patchify(const float* frames, int32_t frames_count, const FrameGeom& s, float* tokens,
                            cudaStream_t stream);
cudaError_t launch_unpatchify(const float* tokens, int32_t frames_count, const FrameGeom& s, float* frames,
                              cudaStream_t stream);

}  // namespace wm::cuda
