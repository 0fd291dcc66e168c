#include "cuda/add_rows.cuh"
#include "cuda/device_util.cuh"
#include "cuda/launch.cuh"

namespace wm::cuda {
namespace {

// blockIdx.y: the block (layer); CTAs stride over its rows, threads over a row
__global__ void add_rows_kernel(const float* __restrict__ rows, const float* __restrict__ per_block, int32_t n_rows,
                                int32_t width, float* __restrict__ out) {
  const int32_t b = static_cast<int32_t>(blockIdx.y);
  const float* p = per_block + static_cast<int64_t>(b) * width;
  for (int32_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const float* in = rows + static_cast<int64_t>(r) * width;
    float* o = out + (static_cast<int64_t>(b) * n_rows + r) * width;
    for (int32_t j = threadIdx.x; j < width; j += blockDim.x) o[j] = in[j] + p[j];
  }
}

}  // namespace

cudaError_t launch_add_rows(const float* rows, const float* per_block, int32_t n_rows, int32_t blocks, int32_t width,
                            float* out, cudaStream_t stream) {
  if (n_rows <= 0 || blocks <= 0 || width <= 0) return cudaSuccess;
  if (blocks > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_rows < 1024 ? n_rows : 1024), static_cast<unsigned>(blocks));
  return launch_kernel(add_rows_kernel, grid, kThreads, 0, stream, rows, per_block, n_rows, width, out);
}

}  // namespace wm::cuda
